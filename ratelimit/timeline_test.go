package ratelimit

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// step is one instant of a timeline: exactly one of decide, end, stale or
// sweep happens at t0+at.
type step struct {
	at time.Duration

	// decide: what the engine is asked, and what it must answer.
	decide  *Request
	allowed bool
	reason  Reason
	retry   time.Duration
	dryRun  bool

	// end: the watch admitted at step end.of ends now, after living since
	// that step, with end.outcome.
	end *ending
	// stale: the API server reported this resourceVersion of pods too old.
	stale string
}

type ending struct {
	of      int
	outcome Outcome
}

// Request shapes used by timelines: alice watching pods in default, from a
// resourceVersion unless said otherwise.
func watch() *Request {
	return &Request{User: "alice", Verb: VerbWatch, Resource: "pods", Namespace: "default", ResourceVersion: "100"}
}

func watchIn(ns string) *Request { r := watch(); r.Namespace = ns; return r }

func watchFrom(rv string) *Request { r := watch(); r.ResourceVersion = rv; return r }

func watchAt(ns, rv string) *Request { r := watchIn(ns); r.ResourceVersion = rv; return r }

func watchSelecting(sel string) *Request { r := watch(); r.LabelSelector = sel; return r }

func watchInitialEvents() *Request {
	r := watch()
	r.SendInitialEvents, r.ResourceVersionMatch = ptrTo(true), "NotOlderThan"
	return r
}

// watchWith is a watch from rv with the given resourceVersionMatch and
// sendInitialEvents ("" for absent).
func watchWith(rv, match, sendInitialEvents string) *Request {
	r := watchFrom(rv)
	r.ResourceVersionMatch = match
	if sendInitialEvents != "" {
		r.SendInitialEvents = ptrTo(sendInitialEvents == "true")
	}
	return r
}

func ptrTo[T any](v T) *T { return &v }

func list() *Request {
	return &Request{User: "alice", Verb: VerbList, Resource: "pods", Namespace: "default"}
}

func ok(at time.Duration, r *Request) step { return step{at: at, decide: r, allowed: true} }

func no(at time.Duration, r *Request, reason Reason, retry time.Duration) step {
	return step{at: at, decide: r, reason: reason, retry: retry}
}

func dry(at time.Duration, r *Request, reason Reason, retry time.Duration) step {
	return step{at: at, decide: r, allowed: true, reason: reason, retry: retry, dryRun: true}
}

func closed(at time.Duration, of int) step { return step{at: at, end: &ending{of, OutcomeClosed}} }

func failed(at time.Duration, of int) step { return step{at: at, end: &ending{of, OutcomeError}} }

func staleSeen(at time.Duration, rv string) step { return step{at: at, stale: rv} }

const ms = time.Millisecond
const s = time.Second

func TestTimelines(t *testing.T) {
	opens := func(perMinute, burst int32) Budget {
		return Budget{Name: "opens", Limits: Limits{WatchOpensPerMinute: perMinute, WatchBurst: burst}}
	}
	backoff := Budget{Name: "backoff", Backoff: Backoff{Initial: s, Max: 10 * s, ShortWatch: s, ResetAfter: 30 * s}}
	everything := Budget{
		Name:          "everything",
		Limits:        Limits{WatchOpensPerMinute: 60, WatchBurst: 1, MaxConcurrentWatches: 1},
		Backoff:       Backoff{Initial: 5 * s, Max: 10 * s, ShortWatch: s},
		StaleVersions: StaleVersions{Memory: time.Minute},
	}

	for name, tc := range map[string]struct {
		budgets []Budget
		steps   []step
	}{
		"admits a burst of three, then the fourth waits a second for a token": {
			budgets: []Budget{opens(60, 3)},
			steps: []step{
				ok(0, watch()), ok(0, watch()), ok(0, watch()),
				no(0, watch(), ReasonRateLimited, s),
				no(250*ms, watch(), ReasonRateLimited, 750*ms),
				ok(s, watch()),
			},
		},
		"a rejected watch takes no tokens": {
			budgets: []Budget{opens(60, 1)},
			steps: []step{
				ok(0, watch()),
				no(500*ms, watch(), ReasonRateLimited, 500*ms),
				no(900*ms, watch(), ReasonRateLimited, 100*ms),
				ok(s, watch()), // the two rejections above took nothing
			},
		},
		"an instant that arrives late does not refill the bucket twice": {
			budgets: []Budget{opens(60, 2)},
			steps: []step{
				ok(0, watch()),
				ok(s, watch()),
				ok(500*ms, watch()), // from a slower goroutine: decided at t0+1s
				no(1500*ms, watch(), ReasonRateLimited, 500*ms),
			},
		},
		"a watch asking for initial state costs initialStateCost tokens": {
			budgets: []Budget{{Name: "lists", Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 4, InitialStateCost: 3}}},
			steps: []step{
				ok(0, watchFrom("")),
				no(0, watchFrom("0"), ReasonRateLimited, 2*s), // 1 token left, 3 needed
				ok(0, watch()),                                // a resourceVersion costs 1
				no(0, watch(), ReasonRateLimited, s),
				ok(3*s, watchInitialEvents()),
				no(3*s, watchWith("42", "NotOlderThan", "true"), ReasonRateLimited, 3*s), // from a version, but with the state
				ok(4*s, watchWith("", "NotOlderThan", "false")),                          // from now, without the state: 1
			},
		},
		"caps concurrent watches and frees the slot when one ends": {
			budgets: []Budget{{Name: "cap", Limits: Limits{MaxConcurrentWatches: 2}}},
			steps: []step{
				ok(0, watch()), ok(0, watch()),
				no(s, watch(), ReasonTooManyWatches, TooManyWatchesRetryAfter),
				closed(2*s, 0),
				ok(2*s, watch()),
				no(2*s, watch(), ReasonTooManyWatches, TooManyWatchesRetryAfter),
			},
		},
		"releasing a watch twice frees one slot only": {
			budgets: []Budget{{Name: "cap", Limits: Limits{MaxConcurrentWatches: 1}}},
			steps: []step{
				ok(0, watch()),
				closed(s, 0), closed(s, 0),
				ok(s, watch()),
				no(s, watch(), ReasonTooManyWatches, TooManyWatchesRetryAfter),
			},
		},
		"lists are not capped by concurrency": {
			budgets: []Budget{{Name: "cap", Limits: Limits{MaxConcurrentWatches: 1}}},
			steps:   []step{ok(0, watch()), ok(0, list()), ok(0, list())},
		},
		"lists take tokens from the list bucket only": {
			budgets: []Budget{{Name: "lists", Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 1, ListsPerMinute: 30, ListBurst: 2}}},
			steps: []step{
				ok(0, list()), ok(0, list()),
				no(0, list(), ReasonRateLimited, 2*s),
				ok(0, watch()), // the watch bucket is untouched
				ok(2*s, list()),
			},
		},
		"backs off 4s after the third watch that died within a second": {
			budgets: []Budget{backoff},
			steps: []step{
				ok(0, watch()), closed(500*ms, 0), // 1st failure: 1s
				no(s, watch(), ReasonBackingOff, 500*ms),
				ok(1500*ms, watch()), closed(2*s, 3), // 2nd: 2s
				no(3*s, watch(), ReasonBackingOff, s),
				ok(4*s, watch()), closed(4500*ms, 6), // 3rd: 4s
				no(5*s, watch(), ReasonBackingOff, 3500*ms),
				ok(8500*ms, watch()),
			},
		},
		"a watch that ends with an error is a failure however long it lived": {
			budgets: []Budget{backoff},
			steps: []step{
				ok(0, watch()), failed(10*s, 0),
				no(10*s, watch(), ReasonBackingOff, s),
				ok(11*s, watch()),
			},
		},
		"a watch that lived past resetAfter clears the backoff": {
			budgets: []Budget{backoff},
			steps: []step{
				ok(0, watch()), closed(100*ms, 0), // 1s
				ok(1100*ms, watch()), closed(1200*ms, 2), // 2s
				ok(3200*ms, watch()), failed(40*s, 4), // lived 36.8s, errors: reset anyway
				ok(40*s, watch()), closed(40100*ms, 6), // 1s again, not 4s
				no(41*s, watch(), ReasonBackingOff, 100*ms),
			},
		},
		"a watch that lived long enough but not past resetAfter keeps the backoff": {
			budgets: []Budget{backoff},
			steps: []step{
				ok(0, watch()), closed(100*ms, 0), // 1s
				ok(1100*ms, watch()), closed(5*s, 2), // healthy, nothing changes
				ok(5*s, watch()), closed(5100*ms, 4), // 2nd failure: 2s
				no(6*s, watch(), ReasonBackingOff, 1100*ms),
			},
		},
		"backoff never exceeds max": {
			budgets: []Budget{backoff},
			steps: []step{
				ok(0, watch()), closed(0, 0), // 1s
				ok(1*s, watch()), closed(1*s, 2), // 2s
				ok(3*s, watch()), closed(3*s, 4), // 4s
				ok(7*s, watch()), closed(7*s, 6), // 8s
				ok(15*s, watch()), closed(15*s, 8), // 10s, not 16s
				no(15*s, watch(), ReasonBackingOff, 10*s),
				ok(25*s, watch()),
			},
		},
		"watches of one key that fail together count once: the delay is initial, not 2^n": {
			budgets: []Budget{backoff},
			steps: []step{
				// Five pods of one service account watch the same thing;
				// the API server restarts and all five watches fail.
				ok(0, watch()), ok(0, watch()), ok(0, watch()), ok(0, watch()), ok(0, watch()),
				failed(10*s, 0), failed(10*s, 1), failed(10*s, 2), failed(10*s, 3), failed(10*s, 4),
				no(10*s, watch(), ReasonBackingOff, s),
				ok(11*s, watch()),
			},
		},
		"a watch in flight when its key failed does not count, even failing after the delay ran out": {
			budgets: []Budget{backoff},
			steps: []step{
				ok(0, watch()), ok(0, watch()),
				failed(5*s, 0), // 1s, until 6s
				failed(8*s, 1), // opened before the failure: the same event
				ok(8*s, watch()),
				closed(8100*ms, 4), // opened after the delay: the 2nd failure, 2s
				no(9*s, watch(), ReasonBackingOff, 1100*ms),
			},
		},
		"a watch opened before a failure that fails after a reset counts as a first failure": {
			budgets: []Budget{backoff},
			steps: []step{
				ok(0, watch()),
				ok(20*s, watch()), ok(20*s, watch()),
				failed(21*s, 2), // 1s, until 22s
				closed(35*s, 0), // lived 35s: the key is healthy, cleared
				failed(36*s, 1), // opened before the failure, but the key starts afresh
				no(36*s, watch(), ReasonBackingOff, s),
			},
		},
		"a dry-run key counts failures as enforce would: watches admitted while it backs off do not count": {
			budgets: []Budget{{Name: "dry", Enforcement: DryRun, Backoff: Backoff{Initial: s, Max: 10 * s, ShortWatch: s}}},
			steps: []step{
				ok(0, watch()), closed(100*ms, 0), // 1s, until 1.1s
				dry(200*ms, watch(), ReasonBackingOff, 900*ms), closed(300*ms, 2), // enforce would have refused it
				dry(400*ms, watch(), ReasonBackingOff, 700*ms),
				ok(1100*ms, watch()), closed(1200*ms, 5), // after the delay: the 2nd failure, 2s
				dry(1300*ms, watch(), ReasonBackingOff, 1900*ms),
			},
		},
		"backoff is per watch key: another namespace or selector is not delayed": {
			budgets: []Budget{backoff},
			steps: []step{
				ok(0, watch()), closed(0, 0),
				no(0, watch(), ReasonBackingOff, s),
				ok(0, watchIn("kube-system")),
				ok(0, watchSelecting("app=web")),
				ok(0, &Request{User: "bob", Verb: VerbWatch, Resource: "pods", Namespace: "default", ResourceVersion: "100"}),
				ok(0, list()), // backoff is for watches
			},
		},
		"a stale version is rejected locally before backoff, concurrency and tokens": {
			budgets: []Budget{everything},
			steps: []step{
				ok(0, watchIn("a")), // the bucket is empty and the slot is taken
				staleSeen(0, "42"),
				no(0, watchFrom("42"), ReasonStaleResourceVersion, 0), // the first "too old" is answered at once
				no(0, watchIn("b"), ReasonTooManyWatches, TooManyWatchesRetryAfter),
				closed(100*ms, 0), // a failure of key "a": 5s backoff
				// Back at once with the same stale version: held back for
				// the rest of the backoff its first "too old" started.
				no(200*ms, watchFrom("42"), ReasonStaleResourceVersion, 4800*ms),
				no(200*ms, watchIn("a"), ReasonBackingOff, 4900*ms),
				ok(5100*ms, watchIn("b")), // stale rejections took no tokens
			},
		},
		"a client looping on a stale version is held back, others are not": {
			budgets: []Budget{{
				Name:          "loop",
				Backoff:       Backoff{Initial: s, Max: 4 * s, ShortWatch: s},
				StaleVersions: StaleVersions{Memory: time.Minute},
			}},
			steps: []step{
				staleSeen(0, "7"),
				no(0, watchFrom("7"), ReasonStaleResourceVersion, 0),
				no(100*ms, watchFrom("7"), ReasonStaleResourceVersion, s), // a repeat: at least StaleRepeatHold
				ok(100*ms, watchIn("elsewhere")),                          // another key of the same identity
				// The relist's fresh watch on the looping key waits out
				// the backoff like any watch that keeps dying.
				no(100*ms, watchFrom("8"), ReasonBackingOff, 2*s), // second failure, no jitter here
			},
		},
		"only a watch the API server answers 410 for a too old version is answered locally": {
			budgets: []Budget{{Name: "stale-only", StaleVersions: StaleVersions{Memory: 5 * time.Minute}}},
			steps: []step{
				staleSeen(0, "7"),
				no(0, watchFrom("7"), ReasonStaleResourceVersion, 0),
				// A watch-list: the watch cache serves the current state
				// whatever the version.
				ok(0, watchWith("7", "NotOlderThan", "true")),
				// 410 with the WatchList feature, 422 without it.
				ok(0, watchWith("7", "NotOlderThan", "false")),
				// Refused 422 by the API server's validation.
				ok(0, watchWith("7", "Exact", "")),
				ok(0, watchWith("7", "NotOlderThan", "")),
				ok(0, watchWith("7", "", "true")),
				// Refused 400 for its query.
				ok(0, func() *Request { r := watchFrom("7"); r.QueryRefused = true; return r }()),
			},
		},
		"with backoff disabled a client looping on a stale version is answered about once a second": {
			budgets: []Budget{{Name: "stale-only", StaleVersions: StaleVersions{Memory: 5 * time.Minute}}},
			steps: []step{
				staleSeen(0, "7"),
				no(0, watchFrom("7"), ReasonStaleResourceVersion, 0), // the first "too old": at once
				no(10*ms, watchFrom("7"), ReasonStaleResourceVersion, StaleRepeatHold),
				no(1010*ms, watchFrom("7"), ReasonStaleResourceVersion, StaleRepeatHold),
				no(1010*ms, watchAt("elsewhere", "7"), ReasonStaleResourceVersion, 0), // another key: its first
				ok(1010*ms, watchFrom("8")),                                           // no backoff to wait out
				// A minute after its last stale answer the key starts
				// afresh: a client that came back this late resynced.
				no(62*s, watchFrom("7"), ReasonStaleResourceVersion, 0),
				no(62*s, watchFrom("7"), ReasonStaleResourceVersion, StaleRepeatHold),
			},
		},
		"a short backoff does not shorten a repeated stale answer's hold": {
			budgets: []Budget{{
				Name:          "short",
				Backoff:       Backoff{Initial: 200 * ms, Max: 10 * s, ShortWatch: 100 * ms},
				StaleVersions: StaleVersions{Memory: time.Minute},
			}},
			steps: []step{
				staleSeen(0, "7"),
				no(0, watchFrom("7"), ReasonStaleResourceVersion, 0),                     // 1st failure: until 200ms
				no(100*ms, watchFrom("7"), ReasonStaleResourceVersion, StaleRepeatHold),  // 100ms left; 2nd: until 500ms
				no(1100*ms, watchFrom("7"), ReasonStaleResourceVersion, StaleRepeatHold), // none left; 3rd: until 1.9s
				no(1200*ms, watchFrom("7"), ReasonStaleResourceVersion, StaleRepeatHold), // 700ms left; 4th: until 2.8s
				no(1300*ms, watchFrom("7"), ReasonStaleResourceVersion, 1500*ms),         // the backoff now holds longer
			},
		},
		"AtOrBelow: a version at or below one reported too old is stale, as the server parses it": {
			budgets: []Budget{{Name: "watermark", StaleVersions: StaleVersions{Match: StaleMatchAtOrBelow, Memory: time.Minute}}},
			steps: []step{
				staleSeen(0, "100"),
				no(0, watchAt("a", "50"), ReasonStaleResourceVersion, 0), // below the watermark
				no(0, watchAt("b", "100"), ReasonStaleResourceVersion, 0),
				no(0, watchAt("c", "000100"), ReasonStaleResourceVersion, 0), // kube-apiserver reads 100
				ok(0, watchAt("d", "101")),
				ok(0, watchAt("e", "0")), ok(0, watchAt("f", "")), ok(0, watchAt("g", "00")), // never too old
				ok(0, watchAt("h", "1e2")), ok(0, watchAt("i", "-5")), // unparsable: the server answers itself
				staleSeen(30*s, "40"), // a lower report does not lower the watermark
				no(59*s, watchAt("j", "99"), ReasonStaleResourceVersion, 0),
				// The report of 100 is a minute old: only the report of 40,
				// made at 30s, still counts.
				ok(60*s, watchAt("k", "99")),
				no(60*s, watchAt("l", "40"), ReasonStaleResourceVersion, 0),
				no(60*s, watchAt("m", "1"), ReasonStaleResourceVersion, 0),
				ok(90*s, watchAt("n", "40")),
			},
		},
		"Exact: only the version reported too old is stale": {
			budgets: []Budget{{Name: "exact", StaleVersions: StaleVersions{Match: StaleMatchExact, Memory: time.Minute}}},
			steps: []step{
				staleSeen(0, "100"),
				no(0, watchAt("a", "100"), ReasonStaleResourceVersion, 0),
				no(0, watchAt("b", "0000100"), ReasonStaleResourceVersion, 0), // kube-apiserver reads 100
				ok(0, watchAt("c", "50")),
				ok(0, watchAt("d", "99")),
				ok(0, watchAt("e", "101")),
				staleSeen(30*s, "40"),
				no(59*s, watchAt("f", "40"), ReasonStaleResourceVersion, 0),
				ok(59*s, watchAt("g", "39")),
				ok(60*s, watchAt("h", "100")),
			},
		},
		"a dry-run budget reports stale versions but never holds them back": {
			budgets: []Budget{{
				Name:          "dry",
				Enforcement:   DryRun,
				Backoff:       Backoff{Initial: s, Max: 4 * s, ShortWatch: s},
				StaleVersions: StaleVersions{Memory: time.Minute},
			}},
			steps: []step{
				staleSeen(0, "7"),
				dry(0, watchFrom("7"), ReasonStaleResourceVersion, 0),
				dry(0, watchFrom("7"), ReasonStaleResourceVersion, 0),
			},
		},
		"backoff comes before concurrency, concurrency before tokens": {
			budgets: []Budget{{
				Name:    "ordered",
				Limits:  Limits{WatchOpensPerMinute: 60, WatchBurst: 1, MaxConcurrentWatches: 2},
				Backoff: Backoff{Initial: 5 * s, Max: 10 * s, ShortWatch: s},
			}},
			steps: []step{
				ok(0, watchIn("a")),
				ok(s, watchIn("b")), closed(1500*ms, 1), // b backs off 5s
				ok(2*s, watchIn("c")), // two open, bucket empty
				no(2*s, watchIn("b"), ReasonBackingOff, 4500*ms),
				no(2*s, watchIn("d"), ReasonTooManyWatches, TooManyWatchesRetryAfter),
				closed(2*s, 0),
				no(2*s, watchIn("d"), ReasonRateLimited, s),
				ok(3*s, watchIn("d")),
			},
		},
		"a stale version is forgotten after memory, and only for its resource": {
			budgets: []Budget{{Name: "stale", StaleVersions: StaleVersions{Memory: time.Minute}}},
			steps: []step{
				staleSeen(0, "42"),
				no(59*s, watchFrom("42"), ReasonStaleResourceVersion, 0),
				ok(59*s, &Request{User: "alice", Verb: VerbWatch, Group: "apps", Resource: "deployments", ResourceVersion: "42"}),
				ok(59*s, watchFrom("43")),
				ok(60*s, watchFrom("42")),
			},
		},
		"stale versions pass when the action is Pass": {
			budgets: []Budget{{Name: "stale", StaleVersions: StaleVersions{Action: StalePass, Memory: time.Minute}}},
			steps:   []step{staleSeen(0, "42"), ok(s, watchFrom("42"))},
		},
		"dry run allows with the reason enforce would give, and takes no tokens": {
			budgets: []Budget{{Name: "dry", Enforcement: DryRun, Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 1, MaxConcurrentWatches: 1}}},
			steps: []step{
				ok(0, watch()),
				dry(0, watch(), ReasonTooManyWatches, TooManyWatchesRetryAfter),
				closed(0, 0), closed(0, 1),
				dry(500*ms, watch(), ReasonRateLimited, 500*ms),
				closed(600*ms, 4),
				ok(s, watch()), // the dry-run watches took no tokens
			},
		},
		"an exempt budget admits everything": {
			budgets: []Budget{
				{Name: "admins", Precedence: 1, Enforcement: Exempt, Subjects: []Subject{{Kind: Group, Name: "system:masters"}}},
				{Name: "everyone", Precedence: 2, Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 1}},
			},
			steps: []step{
				ok(0, &Request{User: "root", Groups: []string{"system:masters"}, Verb: VerbWatch, Resource: "pods"}),
				ok(0, &Request{User: "root", Groups: []string{"system:masters"}, Verb: VerbWatch, Resource: "pods"}),
				ok(0, watch()),
				no(0, watch(), ReasonRateLimited, s),
			},
		},
		"a request no budget governs has no limits": {
			budgets: []Budget{{Name: "apps", Resources: []ResourceRule{{APIGroups: []string{"apps"}}}, Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 1}}},
			steps:   []step{ok(0, watch()), ok(0, watch()), ok(0, watch())},
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newTestEngine(t, Options{}, tc.budgets...)
			ds := make([]Decision, len(tc.steps))
			for i, st := range tc.steps {
				now := t0.Add(st.at)
				switch {
				case st.decide != nil:
					d := e.Decide(now, st.decide)
					ds[i] = d
					if d.Allowed != st.allowed || d.Reason != st.reason || d.RetryAfter != st.retry || d.DryRun != st.dryRun {
						t.Fatalf("step %d at t0+%s: got allowed=%v reason=%q retry=%s dryRun=%v, want allowed=%v reason=%q retry=%s dryRun=%v",
							i, st.at, d.Allowed, d.Reason, d.RetryAfter, d.DryRun, st.allowed, st.reason, st.retry, st.dryRun)
					}
					wantBudget := ""
					if b := e.Policy().Match(st.decide.User, st.decide.Groups, st.decide.Group, st.decide.Resource, st.decide.Namespace); b != nil {
						wantBudget = b.Name
					}
					if d.Budget != wantBudget {
						t.Fatalf("step %d: budget %q, want %q", i, d.Budget, wantBudget)
					}
					exempt := d.Enforcement == Exempt || d.Budget == ""
					if want := d.Allowed && st.decide.Verb == VerbWatch && !exempt; d.Watch.Valid() != want {
						t.Fatalf("step %d: Watch.Valid() = %v, want %v", i, d.Watch.Valid(), want)
					}
				case st.end != nil:
					start := tc.steps[st.end.of]
					e.WatchEnded(now, ds[st.end.of].Watch, st.at-start.at, st.end.outcome)
				case st.stale != "":
					e.StaleVersionSeen(now, "", "pods", st.stale)
				}
			}
		})
	}
}

// newTestEngine returns an engine without backoff jitter, governed by
// budgets.
func newTestEngine(t testing.TB, opts Options, budgets ...Budget) *Engine {
	t.Helper()
	e := NewEngine(opts)
	e.jitter = 0
	p, err := NewPolicy(budgets)
	if err != nil {
		t.Fatal(err)
	}
	e.SetPolicy(t0, p)
	return e
}
