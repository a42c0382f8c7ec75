package ratelimit

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// replayEvent is one step of recorded traffic: an identity opens a watch
// that it holds for hold, if admitted, and that then ends with outcome
// (OutcomeClosed when unset).
type replayEvent struct {
	at      time.Time
	user    string
	hold    time.Duration
	outcome Outcome
}

// recordedTraffic is three minutes of 40 identities: every 10 s each opens
// a burst of watches and holds each for 25 s (so about three bursts are
// open at once). Identity i's burst is 1 + i%9 watches; the 4 loudest
// (10%) open 50.
func recordedTraffic() []replayEvent {
	var evs []replayEvent
	for i := range 40 {
		burst := 1 + i%9
		if i >= 36 {
			burst = 50
		}
		user := fmt.Sprint("replay-", i)
		// Each identity's bursts start at its own offset within the 10 s.
		for at := time.Duration(i%10) * 100 * ms; at < 3*time.Minute; at += 10 * s {
			for k := range burst {
				evs = append(evs, replayEvent{at: t0.Add(at + time.Duration(k)*ms), user: user, hold: 25 * s})
			}
		}
	}
	slices.SortStableFunc(evs, func(a, b replayEvent) int { return a.at.Compare(b.at) })
	return evs
}

// dyingTraffic is three minutes of 4 more identities whose watches die:
// each opens one every second, which ends with an error after 100 ms.
func dyingTraffic() []replayEvent {
	var evs []replayEvent
	for i := range 4 {
		user := fmt.Sprint("dying-", i)
		for at := time.Duration(i) * 10 * ms; at < 3*time.Minute; at += s {
			evs = append(evs, replayEvent{at: t0.Add(at), user: user, hold: 100 * ms, outcome: OutcomeError})
		}
	}
	return evs
}

// replay runs evs through e (budget b governs every identity) and returns
// the identities refused at least once, with their refusals by reason.
// Watches end in time order, before opens at the same instant.
func replay(e *Engine, evs []replayEvent) map[string]map[Reason]int {
	type open struct {
		end time.Time
		ev  replayEvent
		w   Watch
	}
	var opens []open
	refused := map[string]map[Reason]int{}
	for _, ev := range evs {
		slices.SortFunc(opens, func(a, b open) int { return a.end.Compare(b.end) })
		for len(opens) > 0 && !opens[0].end.After(ev.at) {
			o := opens[0]
			outcome := o.ev.outcome
			if outcome == 0 {
				outcome = OutcomeClosed
			}
			e.WatchEnded(o.end, o.w, o.ev.hold, outcome)
			opens = opens[1:]
		}
		r := &Request{User: ev.user, Verb: VerbWatch, Resource: "pods", Namespace: "default", ResourceVersion: "100"}
		d := e.Decide(ev.at, r)
		if d.Reason != ReasonNone {
			if refused[ev.user] == nil {
				refused[ev.user] = map[Reason]int{}
			}
			refused[ev.user][d.Reason]++
		}
		if d.Watch.Valid() {
			opens = append(opens, open{end: ev.at.Add(ev.hold), ev: ev, w: d.Watch})
		}
	}
	return refused
}

// The suggestion keeps its promise: traffic observed under a DryRun
// budget, replayed under the limits Suggest proposes (share 90), refuses
// no more than the 10% of identities the share leaves out — here exactly
// the 4 loud ones, and none of the others.
func TestSuggestedLimitsRefuseAtMostTheShareLeftOut(t *testing.T) {
	evs := recordedTraffic()
	observed := Budget{Name: "b", Enforcement: DryRun, Limits: Limits{WatchOpensPerMinute: 6, WatchBurst: 2, MaxConcurrentWatches: 2, InitialStateCost: 1}}
	e := newTestEngine(t, Options{}, observed)
	if dry := replay(e, evs); len(dry) != 40 {
		t.Fatalf("DryRun would have refused %d identities, want all 40 under its tight limits", len(dry))
	}
	st := e.Stats()["b"]
	s := Suggest(&st.Observed, observed.Limits, Suggestion{Share: 90, HeadroomPercent: 150})
	if s.WouldRefuse != 40 || s.Identities != 40 {
		t.Errorf("Suggest: WouldRefuse %d of %d identities, want 40 of 40", s.WouldRefuse, s.Identities)
	}

	suggested := Budget{Name: "b", Limits: Limits{
		WatchOpensPerMinute: s.WatchOpensPerMinute, WatchBurst: s.WatchBurst,
		MaxConcurrentWatches: s.MaxConcurrentWatches, InitialStateCost: 1,
	}}
	enforced := newTestEngine(t, Options{}, suggested)
	refused := replay(enforced, evs)
	t.Logf("suggested %d/min b%d w%d; refused %v", s.WatchOpensPerMinute, s.WatchBurst, s.MaxConcurrentWatches, refused)
	if len(refused) > 4 {
		t.Errorf("the suggested limits refused %d identities, want at most the 4 (10%%) the share leaves out", len(refused))
	}
	for user := range refused {
		var i int
		if _, err := fmt.Sscanf(user, "replay-%d", &i); err != nil {
			t.Fatalf("refused identity %q is not one of the replay's: %v", user, err)
		}
		if i < 36 {
			t.Errorf("%s, within the share, was refused: %v", user, refused[user])
		}
	}
	// Observed again under the suggested limits, the suggestion counts
	// the identities they refused.
	again := enforced.Stats()["b"]
	if got := Suggest(&again.Observed, suggested.Limits, Suggestion{Share: 90, HeadroomPercent: 150}).WouldRefuse; got != int64(len(refused)) {
		t.Errorf("WouldRefuse under the suggested limits = %d, want the %d identities refused", got, len(refused))
	}
}

// A stale loop is refused whatever the limits: Suggest counts the
// identities answered stale, and status.suggested's wouldRefuse includes
// them while the budget rejects stale versions.
func TestSuggestCountsStaleLoops(t *testing.T) {
	b := Budget{Name: "b", Enforcement: DryRun, StaleVersions: StaleVersions{Memory: time.Minute}}
	e := newTestEngine(t, Options{}, b)
	e.StaleVersionSeen(t0, "", "pods", "100")
	for i := range 3 {
		r := watchFrom("100")
		r.User = fmt.Sprint("looper-", i)
		if d := e.Decide(t0.Add(s), r); d.Reason != ReasonStaleResourceVersion {
			t.Fatalf("%s: %+v, want a stale answer", r.User, d)
		}
	}
	e.Decide(t0.Add(s), watchFrom("200"))
	st := e.Stats()["b"]
	if got := Suggest(&st.Observed, b.Limits, Suggestion{}); got.StaleLoops != 3 || got.Identities != 4 {
		t.Errorf("StaleLoops %d of %d identities, want 3 of 4", got.StaleLoops, got.Identities)
	}
}

// The suggestion keeps its promise when watches die: backoff refuses
// whatever the limits, so Suggest counts the identities it held back
// (BackingOff, in WouldRefuse and RefusedAnyway), and the suggested limits
// refuse no one but the 10% the share leaves out and those.
func TestSuggestedLimitsCountBackoff(t *testing.T) {
	evs := append(recordedTraffic(), dyingTraffic()...)
	slices.SortStableFunc(evs, func(a, b replayEvent) int { return a.at.Compare(b.at) })
	backoff := Backoff{Initial: s, Max: time.Minute, ShortWatch: 10 * s, ResetAfter: 2 * time.Minute}
	observed := Budget{Name: "b", Enforcement: DryRun, Backoff: backoff,
		Limits: Limits{WatchOpensPerMinute: 600, WatchBurst: 600, InitialStateCost: 1}}
	e := newTestEngine(t, Options{}, observed)
	dry := replay(e, evs)
	for i := range 4 {
		if user := fmt.Sprint("dying-", i); dry[user][ReasonBackingOff] == 0 {
			t.Fatalf("DryRun: %s would not have been held back: %v", user, dry[user])
		}
	}
	st := e.Stats()["b"]
	s := Suggest(&st.Observed, observed.Limits, Suggestion{Share: 90, HeadroomPercent: 150})
	if s.BackingOff != 4 || s.Identities != 44 {
		t.Errorf("Suggest: BackingOff %d of %d identities, want 4 of 44", s.BackingOff, s.Identities)
	}
	if s.WouldRefuse < 4 {
		t.Errorf("Suggest: WouldRefuse %d, want at least the 4 identities backoff held back", s.WouldRefuse)
	}

	suggested := Budget{Name: "b", Backoff: backoff, Limits: Limits{
		WatchOpensPerMinute: s.WatchOpensPerMinute, WatchBurst: s.WatchBurst,
		MaxConcurrentWatches: s.MaxConcurrentWatches, InitialStateCost: 1,
	}}
	enforced := newTestEngine(t, Options{}, suggested)
	refused := replay(enforced, evs)
	t.Logf("suggested %d/min b%d w%d (backing off %d); refused %v", s.WatchOpensPerMinute, s.WatchBurst, s.MaxConcurrentWatches, s.BackingOff, refused)
	if int64(len(refused)) > 4+s.BackingOff {
		t.Errorf("the suggested limits refused %d identities, want at most the 4 (10%%) the share leaves out and the %d backoff holds back", len(refused), s.BackingOff)
	}
	for user, reasons := range refused {
		if strings.HasPrefix(user, "dying-") {
			if len(reasons) != 1 || reasons[ReasonBackingOff] == 0 {
				t.Errorf("%s was refused for more than its backoff: %v", user, reasons)
			}
			continue
		}
		var i int
		if _, err := fmt.Sscanf(user, "replay-%d", &i); err != nil || i < 36 {
			t.Errorf("%s, within the share, was refused: %v", user, reasons)
		}
	}
	again := enforced.Stats()["b"]
	if got := Suggest(&again.Observed, suggested.Limits, Suggestion{Share: 90, HeadroomPercent: 150}); got.BackingOff != 4 || got.WouldRefuse < 4 {
		t.Errorf("under the suggested limits: BackingOff %d, WouldRefuse %d, want 4 and at least 4", got.BackingOff, got.WouldRefuse)
	}
}
