package admit

import (
	"testing"
	"time"
)

// The users behind one caller share its watch opens: one user spends at
// most a quarter of the burst, and the next user still opens.
func TestWatchOpenRateIsSharedByTheUsersBehindACaller(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := NewWatchOpenRate(0.01, 8) // nothing refills while the test runs
	const agent = "system:serviceaccount:agents:agent"
	opened := func(user string, n int) int {
		ok := 0
		for range n {
			if _, allowed := o.allow(t0, agent, user); allowed {
				ok++
			}
		}
		return ok
	}
	if n := opened("ann", 8); n != 2 {
		t.Errorf("ann opened %d of 8, want 2 (a quarter of the burst)", n)
	}
	if n := opened("bob", 1); n != 1 {
		t.Errorf("bob opened %d of 1 after ann, want 1", n)
	}
	if n := opened("", 8); n != 5 {
		t.Errorf("the agent in its own name opened %d, want the 5 left of its burst", n)
	}
	if n := opened("carol", 1); n != 0 {
		t.Errorf("carol opened %d with the agent's burst spent, want 0", n)
	}
}
