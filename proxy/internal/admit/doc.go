// Package admit is the admission filter, for watches and budgeted lists:
// WithAdmission runs its sub-steps in the order proxy/chain.go lists them
// (coalescing, the engine's decision, the wait for a seat among the watch
// opens in flight upstream, fairly queued by tenant and flow
// (watchopenseats.go), the watch guard, the caller's watch-open rate when
// set), answers what they refuse (429 with Retry-After after a short
// bounded delay, or the local stale-version answer; X-Watchgate-Decision
// on every budgeted answer; a Warning header, rate limited, when a budget
// or the guard says no), and hands an admitted watch to proxy/internal/relay.
// A new reason to refuse a watch that depends on the caller's own rate
// belongs here (watchopenrate.go); one that protects the replica, in
// proxy/internal/guard; one of a budget, in ratelimit.
//
// It does not authenticate, classify or forward. proxy's NewServer builds
// it (Admission's fields are its configuration).
package admit
