package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

// An identity that opens many watches at once on more keys than it may
// track (a restarting agent) and sees them all fail together (the API
// server hiccups) backs off its untracked keys for Initial, not for Max:
// the failures are one event. A client that then retries in a loop still
// backs off exponentially.
func TestOverflowKeyCountsAWaveOfFailuresOnce(t *testing.T) {
	const keys, tracked = 200, 4
	e := newTestEngine(t, Options{MaxBackoffKeysPerIdentity: tracked}, Budget{
		Name:    "b",
		Backoff: Backoff{Initial: s, Max: time.Hour, ShortWatch: 10 * s, ResetAfter: time.Minute},
	})
	sel := func(i int) *Request { return watchSelecting(fmt.Sprint("app=", i)) }

	// t0: all open; t0+5s: all fail, in an order of their own.
	ws := make([]Watch, keys)
	for i := range keys {
		d := e.Decide(t0, sel(i))
		expect(t, fmt.Sprint("open ", i), d, true, "", 0)
		ws[i] = d.Watch
	}
	for i := range keys {
		e.WatchEnded(t0.Add(5*s+time.Duration(i)*ms), ws[(i*7)%keys], 5*s+time.Duration(i)*ms, OutcomeError)
	}
	at := t0.Add(5*s + keys*ms)
	last := 5*s + (keys-1)*ms
	// The overflow key counted its first failure, 5.004s after t0 (the
	// fifth to end: the first four took the tracked keys).
	expect(t, "a new untracked key", e.Decide(at, sel(keys)), false, ReasonBackingOff, 5*s+4*ms+s-(at.Sub(t0)))
	for i := range keys {
		if d := e.Decide(at, sel(i)); d.Reason != ReasonBackingOff || d.RetryAfter > s {
			t.Fatalf("key %d after the wave: %+v, want backing off at most %s", i, d, s)
		}
	}
	if n := failuresOf(e, "alice"); n[overflowKey] != 1 {
		t.Errorf("overflow key failures after a wave of %d: %d, want 1", keys-tracked, n[overflowKey])
	}

	// A loop: each open after the previous failure's delay, failing at
	// once, doubles the delay: 2s, 4s, 8s.
	now := t0.Add(last + 2*s)
	for n, want := range []time.Duration{2 * s, 4 * s, 8 * s} {
		r := sel(keys + 1 + n)
		d := e.Decide(now, r)
		expect(t, fmt.Sprint("loop ", n), d, true, "", 0)
		e.WatchEnded(now, d.Watch, 0, OutcomeError)
		expect(t, fmt.Sprint("after loop ", n), e.Decide(now, sel(keys)), false, ReasonBackingOff, want)
		now = now.Add(want)
	}
}

// Many keys of one identity opened at once, some tracked, fail together:
// each tracked key counts once too.
func TestTrackedKeysCountAWaveOfFailuresOnce(t *testing.T) {
	e := newTestEngine(t, Options{}, Budget{
		Name:    "b",
		Backoff: Backoff{Initial: s, Max: time.Hour, ShortWatch: 10 * s},
	})
	// Ten watches on each of three keys.
	var ws []Watch
	for range 10 {
		for _, ns := range []string{"a", "b", "c"} {
			ws = append(ws, e.Decide(t0, watchIn(ns)).Watch)
		}
	}
	for i, w := range ws {
		e.WatchEnded(t0.Add(time.Duration(i)*ms), w, time.Duration(i)*ms, OutcomeClosed)
	}
	for k, n := range failuresOf(e, "alice") {
		if n != 1 {
			t.Errorf("key %v: %d failures after one wave, want 1", k, n)
		}
	}
	if got := len(failuresOf(e, "alice")); got != 3 {
		t.Errorf("%d keys back off, want 3", got)
	}
}

// failuresOf returns the failure count of each backoff key of user in the
// engine's only budget.
func failuresOf(e *Engine, user string) map[watchKey]int32 {
	out := map[watchKey]int32{}
	for _, bs := range e.current.Load().states {
		for i := range bs.shards {
			sh := &bs.shards[i]
			sh.mu.Lock()
			sh.each(func(id *identity) {
				if id.user != user {
					return
				}
				for k, st := range id.backoff {
					out[k] = st.failures
				}
			})
			sh.mu.Unlock()
		}
	}
	return out
}
