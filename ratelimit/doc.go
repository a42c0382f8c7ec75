// Package ratelimit is watchgate's decision engine: pure Go, no HTTP, no API
// server. It answers one question per request — admit or reject, why, and
// for how long — and learns from how each admitted watch ended.
//
// An Engine holds per-identity token buckets (bucket.go: the arithmetic of
// golang.org/x/time/rate.Limiter without its lock, tested against it) for
// watch opens and lists, a cap on concurrent watches, per-watch-key
// exponential backoff, and a memory of resourceVersions the API server has
// declared too old. Its rules come from an immutable Policy, compiled from
// WatchBudgets by the controllers and swapped in atomically; a swap keeps
// every identity's accrued state, and an open watch counts against the
// budget that governs it now, whatever budgets came and went since it
// opened. Every method takes the current time as a parameter, so tests are
// timelines at fixed instants.
//
// A proxy uses it like this:
//
//	d := engine.Decide(time.Now(), &ratelimit.Request{...})
//	if !d.Allowed {
//		// 429 with Retry-After: d.RetryAfter, or for
//		// ReasonStaleResourceVersion a 410 Expired watch event sent
//		// after holding it back for d.RetryAfter (capped).
//	}
//	start := time.Now()
//	// ... stream the watch; on an ERROR 410 event:
//	engine.StaleVersionSeen(time.Now(), group, resource, rv)
//	// ... when it ends (a watch-list: whether its initial-events-end
//	// bookmark went by, first):
//	engine.WatchListEnded(time.Now(), d.Watch, complete)
//	engine.WatchEnded(time.Now(), d.Watch, time.Since(start), outcome)
//
// and calls Sweep every 30s and Stats for the budgets' status.
//
// The tour:
//   - policy.go: Policy and the budgets it is compiled from, StaleMatch;
//   - validate.go: Budget.Validate, field-path errors;
//   - compile.go: NewPolicy and CompileValid (validation and defaults,
//     once per budget) and matching (lowest precedence, then name);
//   - request.go: Request, Decision, Watch, Reason and its words
//     (Reason.Text), Outcome, StaleRepeatHold;
//   - engine.go: Engine, Options, Decide, WatchEnded, SetPolicy;
//   - regovern.go: a swap moves each open watch, with its count, to the
//     budget that governs it in the new policy;
//   - identity.go: per-budget sharded identity state and its buckets;
//   - aggregate.go: hierarchical budgets, the Aggregate an impersonating
//     caller's watches for others are charged to besides their own
//     identities' budgets;
//   - bucket.go: the token bucket, rate.Limiter's arithmetic under the
//     shard's lock (why: see bucket);
//   - backoff.go: the backoff formula, how watch endings and stale
//     answers feed it (a wave of failures counts once), and the
//     per-identity overflow key;
//   - watchkey.go: the fixed-size hash a backoff key is stored as;
//   - stale.go: the stale-resourceVersion memory (parsed versions, the
//     per-resource watermark);
//   - keycap.go: the one counter of tracked keys against their caps;
//   - keyrate.go: KeyRate, one bucket per key outside any budget (the
//     proxy's per-caller ceiling on watch opens), bounded and swept alike;
//   - sweep.go: idle eviction; stats.go: figures for status; top.go:
//     identities ranked by rejections, opens or open watches, on demand;
//   - observe.go: each identity's observed peaks (opens per minute and
//     per second, watches at once, lists and stale answers per minute)
//     and ObservedPeaks, their per-budget sketch; sketch.go: PeakSketch,
//     the fixed log-scale histogram that sketches merge by adding;
//   - share.go: Shares, the fractions of the budgets one of several
//     replicas enforces, and Allocate, the pure computation a leader
//     makes of them from every replica's Demand; replicas.go:
//     Engine.SetShares and Engine.Demand;
//   - suggest.go: Suggest, the limits that would have admitted a share of
//     the observed peaks, and how many identities the current ones refuse;
//   - watchlists.go: the memory of watch-lists that ended without the
//     bookmark that ends their initial events (WatchListEnded), which
//     refuses an identity's watch-lists of a resource after
//     IncompleteWatchListLimit in a row (ReasonWatchListIncomplete);
//   - resourcelists.go: rebuilds (a LIST's first page, a watch asking for
//     initial state) and each identity's rebuild bucket per resource
//     (Limits.ListsPerMinutePerResource, ReasonResourceListsLimited).
//
// Memory is bounded in count and bytes, whatever clients send: Sweep
// evicts state that changes no decision, and caps bound the rest —
// Options.MaxTrackedKeys for identities (beyond it they share a
// per-budget overflow identity: limited together, never unlimited),
// Options.MaxBackoffKeys and MaxBackoffKeysPerIdentity for backoff keys
// (stored as 128-bit hashes; beyond its cap an identity's failing keys
// back off together), and fixed caps for stale versions (stored as
// numbers). No identity's keys count against another's cap. An
// impersonating caller's Aggregate is one more identity of the budget that
// governs the caller, under the same caps.
package ratelimit
