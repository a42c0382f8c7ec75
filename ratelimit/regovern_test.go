package ratelimit

import (
	"fmt"
	"sync"
	"testing"
)

// An open watch counts against the budget that governs it now: a user
// holding 3 watches under a cap of 3 keeps them counted when the budget is
// edited, deleted and re-created, or taken over by another budget, and
// only a watch's end makes room.
func TestOpenWatchesCountAcrossBudgetChanges(t *testing.T) {
	capped := Budget{Name: "capped", Precedence: 100, Limits: Limits{MaxConcurrentWatches: 3}}
	e := newTestEngine(t, Options{}, capped)
	var held []Watch
	for i := range 3 {
		d := e.Decide(t0, watchIn(fmt.Sprint("ns", i)))
		expect(t, fmt.Sprint("watch ", i), d, true, "", 0)
		held = append(held, d.Watch)
	}
	expect(t, "the 4th", e.Decide(t0, watch()), false, ReasonTooManyWatches, TooManyWatchesRetryAfter)

	// Deleted, then re-created.
	e.SetPolicy(t0.Add(s), mustPolicy(t))
	e.SetPolicy(t0.Add(2*s), mustPolicy(t, capped))
	expect(t, "the 4th after re-creation", e.Decide(t0.Add(2*s), watch()), false, ReasonTooManyWatches, TooManyWatchesRetryAfter)
	if got := e.Stats()["capped"].ActiveWatches; got != 3 {
		t.Errorf("re-created budget's ActiveWatches = %d, want 3", got)
	}

	// Deleted while another budget governs the user: the watches count
	// there; re-created with a lower precedence, it counts them again.
	other := Budget{Name: "other", Precedence: 200, Limits: Limits{MaxConcurrentWatches: 4}}
	e.SetPolicy(t0.Add(3*s), mustPolicy(t, other))
	expect(t, "a 4th under other's cap of 4", e.Decide(t0.Add(3*s), watch()), true, "", 0)
	expect(t, "a 5th under other", e.Decide(t0.Add(3*s), watch()), false, ReasonTooManyWatches, TooManyWatchesRetryAfter)
	e.SetPolicy(t0.Add(4*s), mustPolicy(t, capped, other))
	if st := e.Stats(); st["capped"].ActiveWatches != 4 || st["other"].ActiveWatches != 0 {
		t.Errorf("after capped took over: capped %d, other %d open, want 4 and 0", st["capped"].ActiveWatches, st["other"].ActiveWatches)
	}

	// Each end makes room under the budget that governs the watch now.
	for i, w := range held[:2] {
		e.WatchEnded(t0.Add(5*s), w, 5*s, OutcomeClosed)
		e.WatchEnded(t0.Add(5*s), w, 5*s, OutcomeClosed) // twice: nothing more
		if got := e.Stats()["capped"].ActiveWatches; got != int64(3-i) {
			t.Fatalf("after %d ends, ActiveWatches = %d, want %d", i+1, got, 3-i)
		}
	}
	expect(t, "room for one", e.Decide(t0.Add(5*s), watch()), true, "", 0)
	expect(t, "and no more", e.Decide(t0.Add(5*s), watch()), false, ReasonTooManyWatches, TooManyWatchesRetryAfter)
}

// A watch no budget governs any more, or an Exempt one, stays where it
// was and still ends cleanly.
func TestOpenWatchesLeftUngovernedStillEnd(t *testing.T) {
	capped := Budget{Name: "capped", Limits: Limits{MaxConcurrentWatches: 1}}
	e := newTestEngine(t, Options{}, capped)
	d := e.Decide(t0, watch())
	e.SetPolicy(t0.Add(s), mustPolicy(t, Budget{Name: "exempt", Enforcement: Exempt}))
	e.WatchEnded(t0.Add(2*s), d.Watch, 2*s, OutcomeClosed)
	e.Sweep(t0.Add(2 * s))
	if got := e.identities.count(); got != 0 {
		t.Errorf("%d identities tracked once the removed budget's last watch ended, want 0", got)
	}
	e.SetPolicy(t0.Add(3*s), mustPolicy(t, capped))
	expect(t, "the ended watch counts nowhere", e.Decide(t0.Add(3*s), watch()), true, "", 0)
}

// Watches opening and ending while policies swap back and forth never
// leave a count behind (run with -race).
func TestRegovernRacesWithDecisions(t *testing.T) {
	a := Budget{Name: "a", Precedence: 1, Limits: Limits{MaxConcurrentWatches: 1000}}
	b := Budget{Name: "b", Precedence: 2, Limits: Limits{MaxConcurrentWatches: 1000}}
	e := newTestEngine(t, Options{}, a, b)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				r := watchIn(fmt.Sprint("ns", i%7))
				r.User = fmt.Sprint("user", g)
				d := e.Decide(t0, r)
				e.WatchEnded(t0, d.Watch, s, OutcomeClosed)
			}
		}()
	}
	for i := range 100 {
		if i%2 == 0 {
			e.SetPolicy(t0, mustPolicy(t, b))
		} else {
			e.SetPolicy(t0, mustPolicy(t, a, b))
		}
	}
	wg.Wait()
	for name, st := range e.Stats() {
		if st.ActiveWatches != 0 {
			t.Errorf("%s: ActiveWatches = %d after every watch ended, want 0", name, st.ActiveWatches)
		}
	}
}
