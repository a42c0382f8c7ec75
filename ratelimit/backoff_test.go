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

// A watch open through a failure of its key that fails after Sweep has
// dropped the key is the key's first failure again: nothing remembers the
// wave it belonged to, and the delay is Initial.
func TestAFailureAfterSweepDroppedTheKeyCountsAsTheFirst(t *testing.T) {
	e := newTestEngine(t, Options{IdleAfter: time.Minute}, Budget{
		Name:    "b",
		Backoff: Backoff{Initial: s, Max: time.Hour, ShortWatch: time.Hour, ResetAfter: 2 * time.Hour},
	})
	w1, w2 := e.Decide(t0, watch()).Watch, e.Decide(t0, watch()).Watch
	e.WatchEnded(t0.Add(s), w1, s, OutcomeError) // until t0+2s
	if got := e.Sweep(t0.Add(62 * s)); got != 1 {
		t.Fatalf("Sweep evicted %d, want the key", got)
	}
	held := heldBy(w2)
	e.WatchEnded(t0.Add(70*s), w2, 70*s, OutcomeError)
	expect(t, "after the second failure", e.Decide(t0.Add(70*s), watch()), false, ReasonBackingOff, s)
	if n := failuresOf(e, "alice"); len(n) != 1 || n[e.seeds.watchKeyOf(&held.req)] != 1 {
		t.Errorf("failures %v, want one key with 1", n)
	}
}

// A watch opened while its own key was tracked, whose key a reset then
// dropped, fails into the overflow key: opened while the overflow key was
// backing off, it does not count there (a watch the overflow key governed
// could not have opened then).
func TestAWatchThatFailsIntoABackingOffOverflowKeyDoesNotCount(t *testing.T) {
	e := newTestEngine(t, Options{MaxBackoffKeysPerIdentity: 1}, Budget{
		Name:    "b",
		Backoff: Backoff{Initial: 10 * s, Max: time.Hour, ShortWatch: 10 * s, ResetAfter: 30 * s},
	})
	fail := func(at time.Duration, r *Request) {
		t.Helper()
		d := e.Decide(t0.Add(at), r)
		expect(t, "a watch that fails at once", d, true, "", 0)
		e.WatchEnded(t0.Add(at), d.Watch, 0, OutcomeError)
	}
	long := e.Decide(t0, watchIn("a")).Watch
	c := e.Decide(t0.Add(30*s), watchIn("c")).Watch
	fail(40*s, watchIn("a")) // "a" is tracked: until 50s
	fail(51*s, watchIn("b")) // the overflow key: until 61s
	w := e.Decide(t0.Add(51*s), watchIn("a"))
	expect(t, `"a" after its delay`, w, true, "", 0)
	e.WatchEnded(t0.Add(52*s), long, 52*s, OutcomeClosed) // "a" is healthy: dropped
	heldC := heldBy(c)
	e.WatchEnded(t0.Add(52*s), c, 22*s, OutcomeError) // "c" takes the tracked slot
	e.WatchEnded(t0.Add(53*s), w.Watch, 2*s, OutcomeError)
	n := failuresOf(e, "alice")
	if len(n) != 2 || n[e.seeds.watchKeyOf(&heldC.req)] != 1 || n[overflowKey] != 1 {
		t.Errorf("failures %v, want 1 of \"c\" and 1 of the overflow key", n)
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

// A watch the API server answered 429 (its own flow control) is neither a
// failure nor a success: the key is not backed off, however often and
// however soon it happens, and a failure counted before stays as it was.
func TestAnUpstreamThrottledWatchNeverBacksOff(t *testing.T) {
	e := newTestEngine(t, Options{}, Budget{
		Name:    "b",
		Backoff: Backoff{Initial: time.Minute, Max: time.Hour, ShortWatch: time.Minute},
	})
	r := watchSelecting("app=a")
	for i := range 5 {
		now := t0.Add(time.Duration(i) * s)
		d := e.Decide(now, r)
		expect(t, fmt.Sprint("open ", i), d, true, "", 0)
		e.WatchEnded(now, d.Watch, 0, OutcomeThrottled)
	}
	if n := failuresOf(e, "alice"); len(n) != 0 {
		t.Errorf("failures after five throttled watches: %v, want none", n)
	}
	d := e.Decide(t0.Add(5*s), r)
	expect(t, "after a failure", d, true, "", 0)
	e.WatchEnded(t0.Add(5*s), d.Watch, 0, OutcomeError) // backs off until t0+65s
	d = e.Decide(t0.Add(65*s), r)
	expect(t, "after its delay", d, true, "", 0)
	e.WatchEnded(t0.Add(65*s), d.Watch, 0, OutcomeThrottled)
	if n := failuresOf(e, "alice"); len(n) != 1 {
		t.Errorf("failures after one failure and a throttled watch: %v, want the one", n)
	}
	expect(t, "after the throttled watch", e.Decide(t0.Add(65*s), r), true, "", 0)
}
