package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

// An identity whose stale watches use more keys than it may track (a
// leaked token looping on made-up selectors) is held back on those
// answers, but cannot back off the identity's other watches: stale
// answers cost the API server nothing, and keep their overflow apart.
func TestStaleAnswersBeyondTheKeyCapDoNotBackOffOtherKeys(t *testing.T) {
	e := newTestEngine(t, Options{MaxBackoffKeysPerIdentity: 2}, Budget{
		Name:          "b",
		Backoff:       Backoff{Initial: s, Max: time.Minute, ShortWatch: s},
		StaleVersions: StaleVersions{Memory: time.Hour},
	})
	e.StaleVersionSeen(t0, "", "pods", "100")
	stale := func(i int) *Request { return watchSelecting(fmt.Sprint("made-up=", i)) }
	victim := func() *Request { r := watchIn("elsewhere"); r.ResourceVersion = ""; return r }

	// t0: 65 made-up keys answered "too old", each twice, 10 s apart: 2
	// keys fit, 63 go to the overflow.
	for round := range 2 {
		at := t0.Add(time.Duration(round) * 10 * s)
		for i := range 65 {
			d := e.Decide(at, stale(i))
			if d.Reason != ReasonStaleResourceVersion {
				t.Fatalf("round %d, key %d: %+v, want stale", round, i, d)
			}
		}
	}
	// t0+10s: the overflowed keys' repeats are held back (the stale
	// overflow backs off), ...
	if d := e.Decide(t0.Add(10*s+ms), stale(64)); d.RetryAfter < s {
		t.Errorf("an overflowed stale key's repeat: held %s, want at least 1s", d.RetryAfter)
	}
	// ... but another watch of the same identity opens at once.
	expect(t, "an unrelated watch of the same identity", e.Decide(t0.Add(10*s+2*ms), victim()), true, "", 0)

	// Forwarded watches that fail on ever new keys still back the
	// identity's untracked keys off as one.
	for i := range 5 {
		r := watchAt(fmt.Sprint("failing-", i), "")
		e.WatchEnded(t0.Add(20*s), e.Decide(t0.Add(20*s), r).Watch, 0, OutcomeError)
	}
	if d := e.Decide(t0.Add(20*s), victim()); d.Reason != ReasonBackingOff {
		t.Errorf("an untracked key after upstream failures beyond the cap: %+v, want BackingOff", d)
	}
}
