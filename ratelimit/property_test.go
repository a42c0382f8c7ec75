package ratelimit

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// The budget every random timeline is checked against, and a DryRun one
// for the user "dreamer" so that its paths run too.
var (
	propertyBudget = Budget{
		Name:       "enforced",
		Precedence: 2,
		Limits: Limits{WatchOpensPerMinute: 30, WatchBurst: 4, MaxConcurrentWatches: 3, InitialStateCost: 2, ListsPerMinute: 60, ListBurst: 2,
			ListsPerMinutePerResource: 30, ListBurstPerResource: 1},
		Backoff:       Backoff{Initial: 500 * ms, Max: 8 * s, ShortWatch: s, ResetAfter: 5 * s},
		StaleVersions: StaleVersions{Memory: 3 * s},
	}
	dreamerBudget = Budget{
		Name:        "dry",
		Precedence:  1,
		Enforcement: DryRun,
		Subjects:    []Subject{{Kind: User, Name: "dreamer"}},
		Limits:      Limits{WatchOpensPerMinute: 6, WatchBurst: 1, MaxConcurrentWatches: 1},
		Backoff:     Backoff{Initial: s, Max: 2 * s, ShortWatch: s},
		// Exact, while propertyBudget has the default AtOrBelow.
		StaleVersions: StaleVersions{Match: StaleMatchExact, Memory: 2 * s},
	}
)

var (
	users      = []string{"alice", "bob", "dreamer"}
	namespaces = []string{"default", "kube-system"}
	versions   = []string{"", "0", "100", "200", "000200", "150", "1e3", "00"}
)

// admission is one admitted watch, as the timeline saw it.
type admission struct {
	at   time.Time
	cost float64
	user string
	w    Watch
	// watchList: the watch asked for initial events (sendInitialEvents).
	watchList bool
}

// runTimeline drives an engine with the operations encoded in ops (3 bytes
// each) and fails t when an invariant breaks:
//   - admitted watch tokens in any window W never exceed burst + rate·W;
//   - open watches never exceed MaxConcurrentWatches (Enforce);
//   - every backoff delay is within [Initial, Max], and so is RetryAfter;
//   - a watch asks for a version reported stale within Memory exactly when
//     it is rejected as stale;
//   - the engine's open-watch count matches the timeline's;
//   - rejected means not allowed in Enforce, and allowed in DryRun.
//
// It returns the engine's decision counts.
func runTimeline(t *testing.T, ops []byte) map[Reason]int64 {
	// Small caps, so that timelines reach the overflow identity and the
	// per-identity overflow backoff key.
	e := NewEngine(Options{MaxTrackedKeys: 6, MaxBackoffKeys: 3, MaxBackoffKeysPerIdentity: 1, IdleAfter: 10 * s, Seed: 7})
	p := mustPolicy(t, propertyBudget, dreamerBudget)
	now := t0
	e.SetPolicy(now, p)

	var (
		admitted []admission
		open     []admission // not yet ended
		ended    []Watch
		stale    = map[uint64]time.Time{} // parsed version: last report
		openBy   = map[string]int{}
	)
	perSecond := float64(propertyBudget.Limits.WatchOpensPerMinute) / 60
	burst := float64(propertyBudget.Limits.WatchBurst)
	bo := propertyBudget.Backoff

	for len(ops) >= 3 {
		op, a, b := ops[0], int(ops[1]), int(ops[2])
		ops = ops[3:]
		switch op % 8 {
		case 0: // time passes
			now = now.Add(time.Duration(a*b) * 2 * ms)
		case 1, 2: // a watch
			r := &Request{
				User: users[a%len(users)], Verb: VerbWatch, Resource: "pods",
				Namespace:       namespaces[b%len(namespaces)],
				ResourceVersion: versions[(b>>1)%len(versions)],
			}
			if b&8 != 0 {
				r.SendInitialEvents, r.ResourceVersionMatch = ptrTo(true), "NotOlderThan"
			}
			d := e.Decide(now, r)
			budget := propertyBudget
			if r.User == "dreamer" {
				budget = dreamerBudget
			}
			if d.Budget != budget.Name {
				t.Fatalf("budget %q, want %q", d.Budget, budget.Name)
			}
			if d.Reason != "" && d.Allowed != (budget.Enforcement == DryRun) || d.Reason == "" && !d.Allowed {
				t.Fatalf("%s: allowed=%v with reason %q", budget.Enforcement, d.Allowed, d.Reason)
			}
			if d.Reason != "" && d.Reason != ReasonStaleResourceVersion && d.RetryAfter <= 0 {
				t.Fatalf("reason %q with RetryAfter %s", d.Reason, d.RetryAfter)
			}
			if d.Reason == ReasonBackingOff && d.RetryAfter > budget.Backoff.Max {
				t.Fatalf("backing off %s, more than max %s", d.RetryAfter, budget.Backoff.Max)
			}
			if isStale := r.fromVersion() && staleIn(stale, r.ResourceVersion, now, budget.StaleVersions); isStale != (d.Reason == ReasonStaleResourceVersion) {
				t.Fatalf("at %s rv %q, reports %v, %s: reason %q", now.Sub(t0), r.ResourceVersion, stale, budget.StaleVersions.Match, d.Reason)
			}
			if d.Reason == ReasonStaleResourceVersion && (d.DryRun && d.RetryAfter != 0 || d.RetryAfter > max(budget.Backoff.Max, StaleRepeatHold)) {
				t.Fatalf("stale answer held %s (dry run %v): want 0 in DryRun, at most max(Backoff.Max, %s)", d.RetryAfter, d.DryRun, StaleRepeatHold)
			}
			if d.Allowed != d.Watch.Valid() {
				t.Fatalf("allowed=%v but Watch.Valid()=%v", d.Allowed, d.Watch.Valid())
			}
			if !d.Allowed {
				break
			}
			cost := 1.0
			if r.initialState() {
				cost = float64(budget.Limits.InitialStateCost)
			}
			if d.Reason != "" {
				cost = 0 // dry run: admitted without tokens
			}
			ad := admission{now, cost, r.User, d.Watch, r.isWatchList()}
			open = append(open, ad)
			openBy[r.User]++
			if budget.Enforcement == Enforce {
				admitted = append(admitted, ad)
				if n := openBy[r.User]; n > int(budget.Limits.MaxConcurrentWatches) {
					t.Fatalf("%s holds %d watches, cap %d", r.User, n, budget.Limits.MaxConcurrentWatches)
				}
			}
		case 3: // a watch ends
			if len(open) == 0 {
				break
			}
			i := a % len(open)
			ad := open[i]
			open = append(open[:i], open[i+1:]...)
			openBy[ad.user]--
			lifetime := min(now.Sub(ad.at), time.Duration(b)*50*ms)
			outcome := OutcomeClosed
			if b%5 == 0 {
				outcome = OutcomeError
			}
			before, held := backoffOf(ad.w), heldBy(ad.w)
			if ad.watchList {
				e.WatchListEnded(now, ad.w, b%4 == 0)
			}
			e.WatchEnded(now, ad.w, lifetime, outcome)
			ended = append(ended, ad.w)
			if ad.user != "dreamer" {
				checkBackoff(t, e, held, before, now, lifetime, outcome, bo)
			}
		case 4: // a watch is released again
			if len(ended) > 0 {
				e.WatchEnded(now, ended[a%len(ended)], 0, OutcomeError)
			}
		case 5: // the API server says a version is too old
			rv := versions[a%len(versions)]
			e.StaleVersionSeen(now, "", "pods", rv)
			if v, err := strconv.ParseUint(rv, 10, 64); err == nil && v != 0 {
				stale[v] = now
			}
		case 6: // a list
			e.Decide(now, &Request{User: users[a%len(users)], Verb: VerbList, Resource: [...]string{"pods", "secrets"}[b%2], Continuation: b&4 != 0})
		case 7: // housekeeping
			if a%2 == 0 {
				e.Sweep(now)
			} else {
				e.SetPolicy(now, mustPolicy(t, propertyBudget, dreamerBudget))
			}
		}

		var engineOpen int64
		for _, st := range e.Stats() {
			engineOpen += st.ActiveWatches
		}
		if engineOpen != int64(len(open)) {
			t.Fatalf("engine counts %d open watches, the timeline %d", engineOpen, len(open))
		}
	}

	checkWindows(t, admitted, perSecond, burst)
	counts := map[Reason]int64{}
	for _, st := range e.Stats() {
		for r, n := range st.Decisions {
			counts[r] += n
		}
	}
	return counts
}

// staleIn is the model of the stale memory: rv, parsed as kube-apiserver
// does, is stale when a report of it (Exact) or of a version at or above it
// (AtOrBelow) is younger than sv.Memory, and sv rejects stale versions.
func staleIn(reports map[uint64]time.Time, rv string, now time.Time, sv StaleVersions) bool {
	v, err := strconv.ParseUint(rv, 10, 64)
	if err != nil || v == 0 || sv.Action == StalePass {
		return false
	}
	for reported, at := range reports {
		if (reported == v || reported > v && sv.Match != StaleMatchExact) && now.Sub(at) < sv.Memory {
			return true
		}
	}
	return false
}

// backoffOf returns a copy of the backoff of w's identity.
func backoffOf(w Watch) map[watchKey]backoffState {
	id := lockOwner(w.slot)
	defer id.sh.mu.Unlock()
	return maps.Clone(id.backoff)
}

// heldWatch is an open watch's identity and key, which its slot forgets
// when it ends.
type heldWatch struct {
	id  *identity
	req requestKey
}

// heldBy returns the identity and key of w, an open watch.
func heldBy(w Watch) heldWatch {
	id := lockOwner(w.slot)
	defer id.sh.mu.Unlock()
	return heldWatch{id: id, req: w.slot.req}
}

// checkBackoff checks what the end of w, just reported, did to the
// backoff of its key, which was before.
func checkBackoff(t *testing.T, e *Engine, w heldWatch, before map[watchKey]backoffState, now time.Time, lifetime time.Duration, outcome Outcome, bo Backoff) {
	t.Helper()
	sh := w.id.sh
	sh.mu.Lock()
	k := e.seeds.watchKeyOf(&w.req)
	own, tracked := w.id.backoff[k]
	k, st, ok := w.id.lookup(k)
	spill := w.id == sh.spill
	sh.mu.Unlock()
	switch {
	case lifetime >= bo.ResetAfter:
		if tracked {
			t.Fatalf("a watch that lived %s left backoff %+v", lifetime, own)
		}
	case outcome == OutcomeError || lifetime < bo.ShortWatch:
		if !ok {
			if !spill {
				t.Fatalf("a failure below the key cap was not recorded")
			}
			return
		}
		opened, prev := now.Add(-lifetime).UnixNano(), before[k]
		if st == prev {
			// A failure of a watch opened before the key's delay ran
			// out: it failed with the failure that set the delay.
			if opened >= prev.until {
				t.Fatalf("a failure of a watch opened %s after the delay ran out was not counted", time.Duration(opened-prev.until))
			}
			return
		}
		if opened < prev.until {
			t.Fatalf("a failure of a watch opened %s before the delay ran out was counted", time.Duration(prev.until-opened))
		}
		if d := time.Duration(st.until - now.UnixNano()); d < bo.Initial || d > bo.Max {
			t.Fatalf("backoff %s after %d failures, outside [%s, %s]", d, st.failures, bo.Initial, bo.Max)
		}
	}
}

// checkWindows checks that in every window of admissions per user the
// tokens taken stay within burst + rate·window.
func checkWindows(t *testing.T, admitted []admission, perSecond, burst float64) {
	t.Helper()
	byUser := map[string][]admission{}
	for _, ad := range admitted {
		byUser[ad.user] = append(byUser[ad.user], ad)
	}
	for user, ads := range byUser {
		for i := range ads {
			var sum float64
			for j := i; j < len(ads); j++ {
				sum += ads[j].cost
				window := ads[j].at.Sub(ads[i].at).Seconds()
				if limit := burst + perSecond*window + 1e-9; sum > limit {
					t.Fatalf("%s took %.2f tokens in %.3fs, more than %.2f", user, sum, window, limit)
				}
			}
		}
	}
}

func TestBackoffDelayBounds(t *testing.T) {
	bo := Backoff{Initial: 300 * ms, Max: 7 * s}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		n := int32(1 + r.IntN(80))
		jitter := r.Float64()
		d := backoffDelay(bo, n, jitter, r.Float64())
		if d < bo.Initial || d > bo.Max {
			t.Fatalf("backoffDelay(n=%d, jitter=%.2f) = %s, outside [%s, %s]", n, jitter, d, bo.Initial, bo.Max)
		}
	}
	for n, want := range map[int32]time.Duration{1: 300 * ms, 2: 600 * ms, 3: 1200 * ms, 5: 4800 * ms, 6: 7 * s, 1 << 30: 7 * s} {
		if got := backoffDelay(bo, n, 0, 0.5); got != want {
			t.Errorf("backoffDelay(n=%d) without jitter = %s, want %s", n, got, want)
		}
	}
}

// TestJitterSpreadsClients checks that keys failing at the same instant get
// different delays, all within bounds, and that a Seed makes them
// reproducible.
func TestJitterSpreadsClients(t *testing.T) {
	delays := func(seed uint64) []time.Duration {
		e := NewEngine(Options{Seed: seed})
		e.SetPolicy(t0, mustPolicy(t, Budget{Name: "b", Backoff: Backoff{Initial: s, Max: time.Minute, ShortWatch: s}}))
		var out []time.Duration
		for i := range 20 {
			r := watch()
			r.User = fmt.Sprint("u", i)
			e.WatchEnded(t0, e.Decide(t0, r).Watch, 0, OutcomeError)
			e.WatchEnded(t0.Add(s), e.Decide(t0.Add(s), r).Watch, 0, OutcomeError)
			e.WatchEnded(t0.Add(3*s), e.Decide(t0.Add(3*s), r).Watch, 0, OutcomeError)
			d := e.Decide(t0.Add(3*s), r)
			if d.Reason != ReasonBackingOff || d.RetryAfter < s || d.RetryAfter > 4*s {
				t.Fatalf("third failure: %+v, want backing off within [1s, 4s]", d)
			}
			out = append(out, d.RetryAfter)
		}
		return out
	}
	a, b := delays(42), delays(42)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("same seed, different delays:\n%v\n%v", a, b)
	}
	distinct := map[time.Duration]bool{}
	for _, d := range a {
		distinct[d] = true
	}
	if len(distinct) < 10 {
		t.Errorf("20 clients share %d delays: %v", len(distinct), a)
	}
}

// TestRandomTimelines checks the invariants of runTimeline on random
// timelines.
func TestRandomTimelines(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	seen := map[Reason]int64{}
	n := 300
	if testing.Short() {
		n = 30
	}
	for i := range n {
		ops := make([]byte, 3*(50+r.IntN(400)))
		for j := range ops {
			ops[j] = byte(r.Uint32())
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			for r, n := range runTimeline(t, ops) {
				seen[r] += n
			}
		})
	}
	// The timelines must reach every decision, or they prove little.
	for _, r := range reasonsByIndex {
		if r == ReasonAggregateLimited {
			continue // these timelines impersonate nobody; aggregate_test.go's do
		}
		if seen[r] == 0 {
			t.Errorf("no timeline reached %q: %v", r, seen)
		}
	}
	t.Logf("decisions: %v", seen)
}

// FuzzEngine drives random request/end sequences against the invariants of
// runTimeline. The seed corpus makes `go test` run it as a unit test.
func FuzzEngine(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0, 4, 1, 0, 4, 1, 0, 4, 1, 0, 4, 1, 0, 4}) // a burst of watches
	f.Add([]byte{1, 0, 4, 3, 0, 0, 0, 10, 10, 1, 0, 4, 3, 0, 0, 1, 0, 4})
	f.Add([]byte{5, 2, 0, 1, 0, 4, 0, 50, 50, 1, 0, 4}) // stale, then forgotten
	f.Add([]byte{1, 2, 0, 1, 2, 0, 3, 0, 0, 4, 0, 0, 1, 2, 0})
	f.Add([]byte{1, 0, 0, 7, 0, 0, 0, 255, 255, 7, 0, 0, 1, 1, 0, 7, 1, 0, 1, 0, 4})
	// Stale reports of versions as kube-apiserver parses them ("000200",
	// "1e3" unparsable, "00"), then watches at and below them, by alice
	// (AtOrBelow) and dreamer (Exact).
	f.Add([]byte{5, 4, 0, 1, 0, 2, 1, 0, 8, 1, 0, 12, 1, 2, 8, 1, 2, 2, 5, 6, 0, 1, 0, 12})
	// A stale loop: the same stale version again and again, held back.
	f.Add([]byte{5, 3, 0, 1, 0, 6, 1, 0, 6, 0, 10, 10, 1, 0, 6, 1, 0, 6, 0, 30, 30, 1, 0, 6})
	// Failures on more keys than the caps: the overflow backoff key.
	f.Add([]byte{1, 0, 0, 3, 0, 5, 1, 0, 1, 3, 0, 5, 1, 1, 0, 3, 0, 5, 1, 1, 1, 3, 0, 5, 1, 0, 1, 7, 0, 0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 3*2000 {
			ops = ops[:3*2000]
		}
		runTimeline(t, ops)
	})
}
