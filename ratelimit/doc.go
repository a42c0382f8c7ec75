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
package ratelimit
