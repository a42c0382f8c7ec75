package ratelimit

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func mustPolicy(t testing.TB, budgets ...Budget) *Policy {
	t.Helper()
	p, err := NewPolicy(budgets)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func expect(t *testing.T, what string, d Decision, allowed bool, reason Reason, retry time.Duration) {
	t.Helper()
	if d.Allowed != allowed || d.Reason != reason || d.RetryAfter != retry {
		t.Fatalf("%s: got allowed=%v reason=%q retry=%s, want allowed=%v reason=%q retry=%s",
			what, d.Allowed, d.Reason, d.RetryAfter, allowed, reason, retry)
	}
}

func TestSetPolicyKeepsState(t *testing.T) {
	b := Budget{
		Name:    "b",
		Limits:  Limits{WatchOpensPerMinute: 60, WatchBurst: 2, MaxConcurrentWatches: 2},
		Backoff: Backoff{Initial: 10 * s, Max: time.Minute, ShortWatch: s},
	}
	// other governs no pods: b's watches have nowhere to go when b goes.
	other := Budget{Name: "other", Resources: []ResourceRule{{Resources: []string{"configmaps"}}}}
	e := newTestEngine(t, Options{}, b)
	w1 := e.Decide(t0, watchIn("a"))
	w2 := e.Decide(t0, watchIn("b"))
	e.WatchEnded(t0, w2.Watch, 0, OutcomeError) // "b" backs off 10s

	// Halve the rate and raise the cap: the bucket stays empty (it is not
	// refilled by the edit) and now refills at one token per 2s.
	b.Limits.WatchOpensPerMinute = 30
	b.Limits.MaxConcurrentWatches = 3
	e.SetPolicy(t0.Add(500*ms), mustPolicy(t, b, other))
	// 0.5 tokens accrued at the old rate until the edit, 0.25 since.
	expect(t, "after the edit", e.Decide(t0.Add(s), watchIn("c")), false, ReasonRateLimited, 500*ms)
	expect(t, "backoff survives", e.Decide(t0.Add(2*s), watchIn("b")), false, ReasonBackingOff, 8*s)
	expect(t, "at the new rate", e.Decide(t0.Add(2*s), watchIn("c")), true, "", 0)
	if got := e.Stats()["b"].ActiveWatches; got != 2 {
		t.Errorf("ActiveWatches = %d, want 2 (a and c)", got)
	}

	// Removing the budget frees its state; its watches may still end.
	e.SetPolicy(t0.Add(3*s), mustPolicy(t, other))
	// Only the identity holding watches (a and c) is kept, for a budget
	// that may govern them again (see TestOpenWatchesCountAcrossBudgetChanges).
	if ids, keys := e.identities.count(), e.backoffKeys.count(); ids != 1 || keys != 0 {
		t.Errorf("after removal: %d identities, %d backoff keys tracked, want 1 and 0", ids, keys)
	}
	e.WatchEnded(t0.Add(3*s), w1.Watch, 3*s, OutcomeError)
	if got := e.backoffKeys.count(); got != 0 {
		t.Errorf("a removed budget's watch learned backoff: %d keys", got)
	}

	// Coming back, it starts afresh.
	e.SetPolicy(t0.Add(4*s), mustPolicy(t, b))
	for i := range 2 {
		expect(t, fmt.Sprint("fresh bucket ", i), e.Decide(t0.Add(4*s), watchIn("b")), true, "", 0)
	}
}

func TestSweepEvictsOnlyWhatChangesNoDecision(t *testing.T) {
	const idle = time.Minute
	e := newTestEngine(t, Options{IdleAfter: idle}, Budget{
		Name:          "b",
		Limits:        Limits{WatchOpensPerMinute: 6, WatchBurst: 1, ListsPerMinute: 6, ListBurst: 1},
		Backoff:       Backoff{Initial: s, Max: 10 * s, ShortWatch: s},
		StaleVersions: StaleVersions{Memory: 5 * time.Minute},
	})
	req := func(user string) *Request { r := watch(); r.User = user; return r }
	e.Decide(t0, req("open"))                                             // holds a watch
	e.WatchEnded(t0, e.Decide(t0, req("failing")).Watch, 0, OutcomeError) // backoff until t0+1s
	listBy := func(user string) *Request { r := list(); r.User = user; return r }
	e.Decide(t0, listBy("quiet"))            // bucket refills by t0+10s
	e.Decide(t0.Add(55*s), listBy("recent")) // seen recently, bucket filling
	e.StaleVersionSeen(t0, "", "pods", "42")

	if got := e.Sweep(t0.Add(30 * s)); got != 0 {
		t.Errorf("Sweep before IdleAfter evicted %d", got)
	}
	// At t0+70s: quiet is idle; failing's backoff expired 69s ago (>= idle)
	// so it goes too; open holds a watch; recent's bucket is still filling.
	if got, want := e.Sweep(t0.Add(70*s)), 3; got != want {
		t.Errorf("Sweep evicted %d, want %d (quiet, failing and its backoff key)", got, want)
	}
	if got := e.Stats()["b"].TrackedIdentities; got != 2 {
		t.Errorf("TrackedIdentities = %d, want 2", got)
	}
	if got := tracked(e); got != 2 {
		t.Errorf("keys = %d, want 2", got)
	}
	// An evicted identity decides like a new one: a full bucket.
	expect(t, "quiet after eviction", e.Decide(t0.Add(70*s), req("quiet")), true, "", 0)
	// The stale version is kept for the longest memory.
	expect(t, "stale kept", e.Decide(t0.Add(70*s), watchFrom("42")), false, ReasonStaleResourceVersion, 0)
	if got := e.Sweep(t0.Add(5 * time.Minute)); got < 1 {
		t.Errorf("Sweep after memory evicted %d, want the stale version at least", got)
	}
	if got := e.stale.versions.count(); got != 0 {
		t.Errorf("stale versions left: %d", got)
	}
}

func TestMaxTrackedKeys(t *testing.T) {
	e := newTestEngine(t, Options{MaxTrackedKeys: 2, IdleAfter: time.Minute}, Budget{
		Name:    "b",
		Limits:  Limits{WatchOpensPerMinute: 60, WatchBurst: 2},
		Backoff: Backoff{Initial: s, Max: 10 * s, ShortWatch: s},
	})
	req := func(user string) *Request { r := watch(); r.User = user; return r }
	for _, user := range []string{"a", "b"} {
		d := e.Decide(t0, req(user))
		expect(t, user, d, true, "", 0)
		e.WatchEnded(t0, d.Watch, time.Hour, OutcomeClosed)
	}
	// c and d arrive at the cap: they share one overflow identity, so one
	// bucket of 2 between them.
	expect(t, "c", e.Decide(t0, req("c")), true, "", 0)
	d := e.Decide(t0, req("d"))
	expect(t, "d", d, true, "", 0)
	expect(t, "c again", e.Decide(t0, req("c")), false, ReasonRateLimited, s)
	// No backoff is learned for overflowing identities.
	e.WatchEnded(t0, d.Watch, 0, OutcomeError)
	expect(t, "d after failing", e.Decide(t0.Add(s), req("d")), true, "", 0)
	if got := tracked(e); got != 2 {
		t.Errorf("keys = %d, want the cap, 2", got)
	}
	st := e.Stats()["b"]
	if st.TrackedIdentities != 2 || st.ActiveWatches != 2 {
		t.Errorf("stats = %+v, want 2 identities and 2 watches (c's and d's second)", st)
	}
	// Once a and b are swept, new identities are tracked again.
	if got := e.Sweep(t0.Add(time.Hour)); got != 2 {
		t.Errorf("Sweep evicted %d, want 2", got)
	}
	expect(t, "e", e.Decide(t0.Add(time.Hour), req("e")), true, "", 0)
	expect(t, "e", e.Decide(t0.Add(time.Hour), req("e")), true, "", 0)
	expect(t, "e is tracked on its own", e.Decide(t0.Add(time.Hour), req("e")), false, ReasonRateLimited, s)
}

func TestOnThrottledAndStats(t *testing.T) {
	type call struct {
		budget, user string
		reason       Reason
		dryRun       bool
	}
	var calls []call
	e := newTestEngine(t, Options{
		ThrottleNotifyInterval: time.Minute,
		OnThrottled: func(budget, user string, reason Reason, dryRun bool) {
			calls = append(calls, call{budget, user, reason, dryRun})
		},
	},
		Budget{Name: "dry", Precedence: 1, Enforcement: DryRun, Subjects: []Subject{{Kind: User, Name: "dreamer"}}, Limits: Limits{MaxConcurrentWatches: 1}},
		Budget{Name: "b", Precedence: 2, Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 1}},
	)
	req := func(user string) *Request { r := watch(); r.User = user; return r }
	for i := range 5 {
		e.Decide(t0.Add(time.Duration(i)*ms), req("greedy"))
	}
	e.Decide(t0, req("fine"))
	e.Decide(t0, req("dreamer"))
	e.Decide(t0, req("dreamer"))
	e.Decide(t0.Add(61*s), req("greedy"))
	e.Decide(t0.Add(61*s), req("greedy"))

	want := []call{
		{"b", "greedy", ReasonRateLimited, false},
		{"dry", "dreamer", ReasonTooManyWatches, true},
		{"b", "greedy", ReasonRateLimited, false}, // a minute later
	}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Errorf("OnThrottled calls:\n%v\nwant\n%v", calls, want)
	}

	st := e.Stats()
	if got := st["b"].Decisions; got[ReasonAllowed] != 3 || got[ReasonRateLimited] != 5 || got[ReasonBackingOff] != 0 {
		t.Errorf("b decisions = %v", got)
	}
	if got := st["dry"].Decisions; got[ReasonAllowed] != 1 || got[ReasonTooManyWatches] != 1 {
		t.Errorf("dry decisions = %v", got)
	}
	if got := fmt.Sprint(st["b"].TopOffenders); got != "[{greedy 5}]" {
		t.Errorf("top offenders = %s", got)
	}
	if st["dry"].ActiveWatches != 2 || st["b"].ActiveWatches != 3 || st["b"].TrackedIdentities != 2 {
		t.Errorf("stats = %+v", st)
	}
}

func TestTopOffenders(t *testing.T) {
	var top []Offender
	for i, n := range []int64{3, 9, 1, 9, 4, 7, 2, 8} {
		top = addOffender(top, Offender{fmt.Sprint("u", i), n})
	}
	if got := fmt.Sprint(top); got != "[{u1 9} {u3 9} {u7 8} {u5 7} {u4 4}]" {
		t.Errorf("top = %s", got)
	}
}

// TestConcurrentUse runs every method at once; it asserts the books
// balance at the end and is meant to run under -race.
func TestConcurrentUse(t *testing.T) {
	b := Budget{
		Name:    "b",
		Limits:  Limits{WatchOpensPerMinute: 600, WatchBurst: 10, MaxConcurrentWatches: 5, ListsPerMinute: 600, ListBurst: 5},
		Backoff: Backoff{Initial: ms, Max: 10 * ms, ShortWatch: ms},
	}
	e := newTestEngine(t, Options{MaxTrackedKeys: 50, MaxBackoffKeys: 50, MaxBackoffKeysPerIdentity: 2, IdleAfter: ms, Seed: 1}, b)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				now := t0.Add(time.Duration(i) * ms)
				r := watch()
				r.User = fmt.Sprint("u", (g*7+i)%40)
				r.Namespace = fmt.Sprint("ns", i%3)
				d := e.Decide(now, r)
				e.WatchEnded(now, d.Watch, time.Duration(i%3)*ms, Outcome(1+i%2))
				e.WatchEnded(now, d.Watch, 0, OutcomeClosed)
				r.Verb = VerbList
				e.Decide(now, r)
				if i%50 == 0 {
					e.StaleVersionSeen(now, "", "pods", fmt.Sprint(i))
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			e.Sweep(t0.Add(time.Duration(i*10) * ms))
			e.Stats()
			b.Limits.WatchBurst = int32(10 + i%2)
			e.SetPolicy(t0.Add(time.Duration(i*10)*ms), mustPolicy(t, b))
		}
	})
	wg.Wait()
	if got := e.Stats()["b"].ActiveWatches; got != 0 {
		t.Errorf("ActiveWatches = %d after every watch ended", got)
	}
	if got := e.identities.count(); got < 0 || got > 50 {
		t.Errorf("identities = %d, outside [0, 50]", got)
	}
	if got := e.backoffKeys.count(); got < 0 || got > 50 {
		t.Errorf("backoff keys = %d, outside [0, 50]", got)
	}
	e.SetPolicy(t0.Add(time.Hour), nil)
	if got := tracked(e); got != 0 {
		t.Errorf("keys = %d after removing every budget", got)
	}
}

func TestSetPolicyDoesNotDelayEviction(t *testing.T) {
	b := Budget{Name: "b", Limits: Limits{ListsPerMinute: 60, ListBurst: 1}}
	e := newTestEngine(t, Options{IdleAfter: time.Minute}, b)
	expect(t, "list", e.Decide(t0, list()), true, "", 0)
	expect(t, "second list", e.Decide(t0, list()), false, ReasonRateLimited, s)
	b.Limits.ListBurst = 2
	e.SetPolicy(t0.Add(50*s), mustPolicy(t, b))
	if got := e.Sweep(t0.Add(61 * s)); got != 1 {
		t.Errorf("Sweep after a policy swap evicted %d, want 1", got)
	}
}

func TestMemoryStaysBoundedUnderAFlood(t *testing.T) {
	e := newTestEngine(t, Options{MaxTrackedKeys: 100}, Budget{
		Name:    "b",
		Limits:  Limits{WatchOpensPerMinute: 60, WatchBurst: 5},
		Backoff: Backoff{Initial: s, Max: time.Minute, ShortWatch: s},
	})
	for i := range 10_000 {
		r := watch()
		r.User = fmt.Sprint("flood-", i)
		r.LabelSelector = fmt.Sprint("run=", i)
		e.WatchEnded(t0, e.Decide(t0, r).Watch, 0, OutcomeError)
	}
	if got := e.identities.count(); got > 100 {
		t.Errorf("tracking %d identities, cap 100", got)
	}
	if got := e.backoffKeys.count(); got > 100 {
		t.Errorf("tracking %d backoff keys, want at most one per tracked identity", got)
	}
	if got := e.Stats()["b"].TrackedIdentities; got != 100 {
		t.Errorf("tracking %d identities, want the cap, 100: backoff keys have a cap of their own", got)
	}
	for i := range maxStaleVersions + 1000 {
		e.StaleVersionSeen(t0, "", "pods", fmt.Sprint(i+1))
	}
	if got := e.stale.versions.count(); got != maxStaleVersions {
		t.Errorf("remembering %d stale versions, cap %d", got, maxStaleVersions)
	}
	// The overflow identity limited the flood: 5 tokens, then one a second.
	r := watch()
	r.User = "flood-late"
	expect(t, "a late flooder", e.Decide(t0, r), false, ReasonRateLimited, s)
}

// tracked is the number of identities and backoff keys e tracks.
func tracked(e *Engine) int64 { return e.identities.count() + e.backoffKeys.count() }

// Identities whose names hash alike share a chain: each is found by its own
// name, and eviction keeps the others.
func TestIdentitiesWithTheSameHash(t *testing.T) {
	e := NewEngine(Options{})
	bs := newBudgetState(&Budget{Name: "b"}, t0)
	sh := &bs.shards[0]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, u := range []string{"a", "b", "c"} {
		if e.track(sh, 42, u) == nil {
			t.Fatalf("%s not tracked", u)
		}
	}
	for _, u := range []string{"a", "b", "c"} {
		if id := sh.find(42, u); id == nil || id.user != u {
			t.Fatalf("find(%s) = %v", u, id)
		}
	}
	if id := sh.find(42, "d"); id != nil {
		t.Fatalf("find(d) = %v", id)
	}
	if n := sh.evict(func(id *identity) bool { return id.user == "b" }); n != 1 || sh.tracked != 2 {
		t.Fatalf("evicted %d, %d left", n, sh.tracked)
	}
	if sh.find(42, "b") != nil || sh.find(42, "a") == nil || sh.find(42, "c") == nil {
		t.Fatal("eviction lost the wrong identity")
	}
	sh.evict(func(*identity) bool { return true })
	if len(sh.ids) != 0 || sh.tracked != 0 {
		t.Fatalf("%d chains, %d tracked after evicting all", len(sh.ids), sh.tracked)
	}
}

// A budget edit that turns backoff off clears the delays but not the
// record of stale answers: a looping client is still held back.
func TestTurningBackoffOffKeepsStaleRepeatsHeld(t *testing.T) {
	b := Budget{Name: "b", Backoff: Backoff{Initial: 10 * s, Max: time.Minute, ShortWatch: s}, StaleVersions: StaleVersions{Memory: time.Hour}}
	e := newTestEngine(t, Options{}, b)
	e.StaleVersionSeen(t0, "", "pods", "7")
	expect(t, "first stale answer", e.Decide(t0, watchFrom("7")), false, ReasonStaleResourceVersion, 0)
	expect(t, "backing off", e.Decide(t0, watchFrom("8")), false, ReasonBackingOff, 10*s)
	b.Backoff = Backoff{}
	e.SetPolicy(t0.Add(s), mustPolicy(t, b))
	expect(t, "no backoff now", e.Decide(t0.Add(s), watchFrom("8")), true, "", 0)
	expect(t, "a repeat is still held", e.Decide(t0.Add(2*s), watchFrom("7")), false, ReasonStaleResourceVersion, StaleRepeatHold)
}
