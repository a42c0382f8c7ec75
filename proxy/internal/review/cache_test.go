package review

import (
	"fmt"
	"testing"
	"time"
)

// Beyond maxRequesters a newcomer still gets a bucket of its own (the
// least recently used requester is pushed out and starts full again),
// while the shared bucket bounds what all of them get: the opposite of
// ratelimit.KeyRate's overflow bucket, on purpose (see Budget).
func TestBudgetNewcomersBeyondTheCapGetTheirOwnBucket(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	// Shared: 10 at once; each requester: 2 at once; 3 requesters kept.
	b := NewBudget(0.001, 10, 0.001, 2, 3)
	for i := range 3 {
		for range 2 {
			if !b.Allow(fmt.Sprint("flood-", i), LaneNew, t0) {
				t.Fatalf("flood-%d refused within its burst", i)
			}
		}
	}
	// The three tracked requesters are empty; a newcomer is not.
	if b.Allow("flood-0", LaneNew, t0) {
		t.Errorf("flood-0 admitted beyond its burst")
	}
	for range 2 {
		if !b.Allow("newcomer", LaneTrusted, t0) {
			t.Errorf("a trusted newcomer beyond the cap refused: it must get its own bucket")
		}
	}
	// Fresh buckets for ten more requesters: only the shared bucket (4 of
	// 10 left; the trusted lane does not spend it) bounds them.
	admitted := 0
	for i := range 10 {
		for range 2 {
			if b.Allow(fmt.Sprint("flood-new-", i), LaneNew, t0) {
				admitted++
			}
		}
	}
	if admitted != 4 {
		t.Errorf("new requesters admitted %d times, want 4: what the shared bucket had left", admitted)
	}
}
