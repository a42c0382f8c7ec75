// Package ratelimit is watchgate's decision engine: pure Go, no HTTP, no API
// server. It answers one question per request — admit or reject, why, and
// for how long — and learns from how each admitted watch ended.
//
// An Engine holds per-identity token buckets (golang.org/x/time/rate) for
// watch opens and lists, a cap on concurrent watches, per-watch-key
// exponential backoff, and a memory of resourceVersions the API server has
// declared too old. Its rules come from an immutable Policy, compiled from
// WatchBudgets by the controllers and swapped in atomically; a swap keeps
// every identity's accrued state. Every method takes the current time as a
// parameter, so tests are timelines at fixed instants.
//
// A proxy uses it like this:
//
//	d := engine.Decide(time.Now(), &ratelimit.Request{...})
//	if !d.Allowed {
//		// 429 with Retry-After: d.RetryAfter, or for
//		// ReasonStaleResourceVersion a 410 Expired watch event.
//	}
//	start := time.Now()
//	// ... stream the watch; on an ERROR 410 event:
//	engine.StaleVersionSeen(time.Now(), group, resource, rv)
//	// ... when it ends:
//	engine.WatchEnded(time.Now(), d.Watch, time.Since(start), outcome)
//
// and calls Sweep every 30s and Stats for the budgets' status.
//
// The tour:
//   - policy.go: the budgets a Policy is compiled from;
//   - validate.go: Budget.Validate, field-path errors;
//   - compile.go: NewPolicy and matching (lowest precedence, then name);
//   - request.go: Request, Decision, Watch, Reason, Outcome;
//   - engine.go: Engine, Decide, WatchEnded, SetPolicy;
//   - identity.go: per-budget sharded identity state and its buckets;
//   - backoff.go: the backoff formula and how watch endings feed it;
//   - stale.go: the stale-resourceVersion memory;
//   - sweep.go: idle eviction; stats.go: figures for status.
//
// Memory is bounded: Sweep evicts state that changes no decision, and
// Options.MaxTrackedKeys caps the rest (identities beyond it share a
// per-budget overflow identity: limited together, never unlimited).
package ratelimit
