package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

// One identity's peaks through a timeline of requests: calendar minutes
// and seconds start the counts over; a DryRun budget's concurrency is every
// watch open; stale answers count as such, not as opens; a watch that
// backoff would refuse counts as an open and as a backoff refusal.
func TestObservedPeaksTimeline(t *testing.T) {
	e := NewEngine(Options{Seed: 1})
	e.SetPolicy(t0, mustPolicy(t, Budget{Name: "b", Enforcement: DryRun,
		Limits:        Limits{WatchOpensPerMinute: 60, WatchBurst: 2, ListsPerMinute: 1, ListBurst: 1},
		StaleVersions: StaleVersions{Memory: time.Hour},
		Backoff:       Backoff{Initial: 10 * time.Second, Max: time.Minute, ShortWatch: 10 * time.Second}}))
	list := func() *Request { r := watch(); r.Verb = VerbList; return r }
	var open []Watch
	steps := []struct {
		at         time.Duration
		r          *Request
		end        bool // end the oldest open watch instead
		stale      string
		want       peaks
		commentary string
	}{
		{at: 0, r: watch(), want: peaks{1, 1, 1, 0, 0, 0}},
		{at: 100 * time.Millisecond, r: watch(), want: peaks{2, 2, 2, 0, 0, 0}},
		{at: 900 * time.Millisecond, r: watch(), want: peaks{3, 3, 3, 0, 0, 0}, commentary: "DryRun: over the burst, admitted and counted"},
		{at: 1100 * time.Millisecond, end: true, want: peaks{3, 3, 3, 0, 0, 0}},
		{at: 1200 * time.Millisecond, r: watch(), want: peaks{4, 3, 3, 0, 0, 1}, commentary: "a new second: its count starts over; the watch that ended after 1 s failed, so backoff would refuse it"},
		{at: 2 * time.Second, r: list(), want: peaks{4, 3, 3, 1, 0, 1}},
		{at: 3 * time.Second, r: list(), want: peaks{4, 3, 3, 2, 0, 1}},
		{at: 4 * time.Second, stale: "50", want: peaks{4, 3, 3, 2, 0, 1}},
		{at: 5 * time.Second, r: watchFrom("40"), want: peaks{4, 3, 4, 2, 1, 1}, commentary: "would be answered stale: a stale loop's turn, not an open; in DryRun forwarded, so open"},
		{at: 61 * time.Second, r: watch(), want: peaks{4, 3, 5, 2, 1, 1}, commentary: "a new minute: 1 open in it; 5 watches open"},
	}
	for i, st := range steps {
		now := t0.Add(st.at)
		switch {
		case st.end:
			e.WatchEnded(now, open[0], time.Second, OutcomeClosed)
			open = open[1:]
		case st.stale != "":
			e.StaleVersionSeen(now, "", "pods", st.stale)
		default:
			d := e.Decide(now, st.r)
			if d.Watch != (Watch{}) {
				open = append(open, d.Watch)
			}
		}
		obs := e.Stats()["b"].Observed
		if obs.Identities != 1 || !obs.Since.Equal(t0) {
			t.Fatalf("step %d: %d identities since %s, want 1 since t0", i, obs.Identities, obs.Since)
		}
		got := peaks{obs.WatchOpensPerMinute.Quantile(100), obs.WatchBurst.Quantile(100), obs.ConcurrentWatches.Quantile(100),
			obs.ListsPerMinute.Quantile(100), obs.StaleAnswersPerMinute.Quantile(100), obs.BackoffRefusalsPerMinute.Quantile(100)}
		if got != st.want {
			t.Errorf("step %d at %s (%s): peaks %+v, want %+v", i, st.at, st.commentary, got, st.want)
		}
	}
}

// In Enforce, requests count as asked: a watch refused for too many open
// counts as one more wanted at once, and refused opens count as opens.
func TestObservedPeaksEnforce(t *testing.T) {
	e := NewEngine(Options{Seed: 1})
	e.SetPolicy(t0, mustPolicy(t, Budget{Name: "b", Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 10, MaxConcurrentWatches: 2}}))
	for i := range 4 {
		e.Decide(t0.Add(time.Duration(i)*time.Millisecond), watch())
	}
	obs := e.Stats()["b"].Observed
	if got := obs.ConcurrentWatches.Quantile(100); got != 3 {
		t.Errorf("concurrent peak %d, want 3 (2 open, a third wanted)", got)
	}
	if got := obs.WatchOpensPerMinute.Quantile(100); got != 4 {
		t.Errorf("opens peak %d, want 4", got)
	}
}

// An evicted identity's peaks stay in its budget's sketch; one seen again
// counts again. The overflow identity and Exempt budgets are not observed.
func TestObservedPeaksEviction(t *testing.T) {
	e := NewEngine(Options{Seed: 1, MaxTrackedKeys: 2, IdleAfter: time.Minute})
	e.SetPolicy(t0, mustPolicy(t,
		Budget{Name: "b", Enforcement: DryRun, Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 10}},
		Budget{Name: "exempt", Precedence: 1, Enforcement: Exempt, Subjects: []Subject{{Kind: User, Name: "root"}}}))
	for i, u := range []string{"a", "b", "c", "root"} {
		r := watch()
		r.User = u
		d := e.Decide(t0.Add(time.Duration(i)*time.Second), r)
		e.WatchEnded(t0.Add(time.Duration(i)*time.Second), d.Watch, time.Second, OutcomeClosed)
	}
	if got := e.Stats()["b"].Observed.Identities; got != 2 {
		t.Errorf("%d identities observed, want 2 (c is in the overflow identity)", got)
	}
	if got := e.Stats()["exempt"].Observed; got.Identities != 0 || !got.Since.IsZero() {
		t.Errorf("the Exempt budget observed %d identities since %s, want none", got.Identities, got.Since)
	}
	if n := e.Sweep(t0.Add(10 * time.Minute)); n != 2 {
		t.Fatalf("evicted %d, want 2", n)
	}
	obs := e.Stats()["b"].Observed
	if obs.Identities != 2 || obs.WatchOpensPerMinute.Quantile(100) != 1 {
		t.Errorf("after eviction: %d identities, peak %d; want 2 and 1", obs.Identities, obs.WatchOpensPerMinute.Quantile(100))
	}
	r := watch()
	r.User = "a"
	e.Decide(t0.Add(11*time.Minute), r)
	if got := e.Stats()["b"].Observed.Identities; got != 3 {
		t.Errorf("a seen again: %d identities, want 3", got)
	}
}

// The suggestion for known traffic: 20 identities at 5 opens a minute, 2 at
// 60 (all in one minute, one open a second at most for the quiet ones).
func TestSuggest(t *testing.T) {
	var op ObservedPeaks
	e := NewEngine(Options{Seed: 1})
	e.SetPolicy(t0, mustPolicy(t, Budget{Name: "b", Enforcement: DryRun, Limits: Limits{WatchOpensPerMinute: 20, WatchBurst: 5, MaxConcurrentWatches: 100}}))
	for u := range 22 {
		opens, every := 5, 12*time.Second
		if u >= 20 {
			opens, every = 60, 500*time.Millisecond
		}
		for k := range opens {
			r := watch()
			r.User = fmt.Sprint("user-", u)
			d := e.Decide(t0.Add(time.Duration(k)*every), r)
			e.WatchEnded(t0.Add(time.Duration(k)*every), d.Watch, time.Millisecond, OutcomeClosed)
		}
	}
	op = e.Stats()["b"].Observed
	cur := e.Policy().Budgets()[0].Limits
	tests := map[string]struct {
		share, headroom int32
		want            Suggested
	}{
		"90% of identities are the quiet ones: 5/min, 1 at once, ×1.5": {90, 150,
			Suggested{WatchOpensPerMinute: 8, WatchBurst: 2, MaxConcurrentWatches: 2, WouldRefuse: 2, Identities: 22}},
		"the defaults (95%) take in a loud one: 60 rounds up to 63": {0, 0,
			Suggested{WatchOpensPerMinute: 95, WatchBurst: 3, MaxConcurrentWatches: 2, WouldRefuse: 2, Identities: 22}},
		"no headroom": {90, 100,
			Suggested{WatchOpensPerMinute: 5, WatchBurst: 1, MaxConcurrentWatches: 1, WouldRefuse: 2, Identities: 22}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Suggest(&op, cur, Suggestion{Share: tc.share, HeadroomPercent: tc.headroom})
			if got != tc.want {
				t.Errorf("Suggest = %+v\nwant      %+v", got, tc.want)
			}
		})
	}
	// Limits that admit everyone refuse no one; a list limit gets a
	// suggestion (0: nobody listed); initialStateCost bounds the burst.
	loose := Limits{WatchOpensPerMinute: 60, WatchBurst: 60, MaxConcurrentWatches: 2, InitialStateCost: 4, ListsPerMinute: 10, ListBurst: 10}
	if got := Suggest(&op, loose, Suggestion{Share: 90, HeadroomPercent: 150}); got.WouldRefuse != 0 || got.WatchBurst != 4 || got.ListsPerMinute != 0 {
		t.Errorf("Suggest under %+v = %+v, want WouldRefuse 0, WatchBurst 4, ListsPerMinute 0", loose, got)
	}
	if got := Suggest(&ObservedPeaks{}, cur, Suggestion{}); got != (Suggested{}) {
		t.Errorf("Suggest of nothing = %+v, want zero", got)
	}
}
