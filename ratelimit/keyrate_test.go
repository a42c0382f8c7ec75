package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

// A key's burst is admitted at once, then one open per 1/limit; another
// key's bucket is its own; the refused learn when a token is back.
func TestKeyRateTimeline(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	k := NewKeyRate(20, 200, 100)
	for i := range 200 {
		if _, ok := k.Allow(t0, "attacker"); !ok {
			t.Fatalf("open %d of the burst of 200 refused", i+1)
		}
	}
	wait, ok := k.Allow(t0, "attacker")
	if ok || wait != 50*time.Millisecond {
		t.Errorf("open 201 at once: %v %v, want refused, wait 50ms", ok, wait)
	}
	if _, ok := k.Allow(t0, "victim"); !ok {
		t.Errorf("another key's first open refused while the attacker's bucket is empty")
	}
	if wait, ok := k.Allow(t0.Add(25*time.Millisecond), "attacker"); ok || wait != 25*time.Millisecond {
		t.Errorf("25ms later: %v %v, want refused, wait 25ms", ok, wait)
	}
	// A refusal takes nothing: 50ms after the burst, one token is back.
	t1 := t0.Add(50 * time.Millisecond)
	if _, ok := k.Allow(t1, "attacker"); !ok {
		t.Errorf("50ms after the burst: refused, want the token that refilled")
	}
	if _, ok := k.Allow(t1, "attacker"); ok {
		t.Errorf("a second open at the same instant admitted")
	}
	// Over 10 s the key gets its burst back, no more.
	t2 := t1.Add(time.Hour)
	n := 0
	for range 300 {
		if _, ok := k.Allow(t2, "attacker"); ok {
			n++
		}
	}
	if n != 200 {
		t.Errorf("an hour later %d opens admitted at once, want the burst, 200", n)
	}
}

// Buckets that have refilled are dropped; keys beyond the cap share one
// bucket, limited, never unlimited.
func TestKeyRateBounded(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	k := NewKeyRate(1, 2, 3)
	for i := range 3 {
		k.Allow(t0, fmt.Sprint("user-", i))
	}
	if n := k.Len(); n != 3 {
		t.Fatalf("tracked %d keys, want 3", n)
	}
	// Beyond the cap: the overflow bucket's burst (2), shared.
	admitted := 0
	for i := range 10 {
		if _, ok := k.Allow(t0, fmt.Sprint("made-up-", i)); ok {
			admitted++
		}
	}
	if admitted != 2 || k.Len() != 3 {
		t.Errorf("10 new keys beyond the cap: %d admitted, %d tracked; want 2 (the shared burst), 3", admitted, k.Len())
	}
	// Once every bucket has refilled (1 s per token), the next decision
	// drops them.
	if _, ok := k.Allow(t0.Add(time.Second), "user-0"); !ok {
		t.Errorf("user-0 refused a second later")
	}
	if n := k.Len(); n != 3 {
		t.Errorf("1s later (not yet full): %d keys, want 3", n)
	}
	if _, ok := k.Allow(t0.Add(5*time.Second), "late"); !ok {
		t.Errorf("a new key refused 5s later")
	}
	if n := k.Len(); n != 1 {
		t.Errorf("5s later, every other bucket full: %d keys tracked, want 1", n)
	}
}
