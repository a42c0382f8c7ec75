package ratelimit

import (
	"sync"
	"sync/atomic"
	"time"
)

// Verb is the kind of request the engine decides on.
type Verb uint8

const (
	// VerbWatch opens a watch: it holds a concurrency slot until released.
	VerbWatch Verb = iota + 1
	// VerbList is a list; only the optional list bucket applies to it.
	VerbList
)

// Request is what the engine needs to know about one request. The engine
// does not keep references to a Request (it copies the strings it keeps).
type Request struct {
	// User and Groups are the authenticated (or impersonated) identity.
	User   string
	Groups []string
	Verb   Verb
	// Group is the API group ("" for core), Namespace "" for cluster-scoped
	// or all-namespace requests.
	Group, Resource, Namespace   string
	LabelSelector, FieldSelector string
	ResourceVersion              string
	SendInitialEvents            bool
	// Impersonated is true when User and Groups are an identity the caller
	// impersonates (and may), false when they are the caller's own.
	Impersonated bool
}

// initialState reports whether the watch asks the server for the current
// state first, which costs the server a LIST.
func (r *Request) initialState() bool {
	return r.ResourceVersion == "" || r.ResourceVersion == "0" || r.SendInitialEvents
}

// Reason says why a request was, or in DryRun would have been, rejected.
type Reason string

const (
	// ReasonNone: allowed, nothing to report.
	ReasonNone Reason = ""
	// ReasonRateLimited: the identity's watch (or list) bucket lacks the
	// tokens; RetryAfter is the time until it holds them.
	ReasonRateLimited Reason = "RateLimited"
	// ReasonTooManyWatches: the identity holds MaxConcurrentWatches open
	// watches; RetryAfter is TooManyWatchesRetryAfter.
	ReasonTooManyWatches Reason = "TooManyWatches"
	// ReasonBackingOff: recent watches with the same key failed; RetryAfter
	// is the time until the backoff delay expires.
	ReasonBackingOff Reason = "BackingOff"
	// ReasonStaleResourceVersion: the API server recently declared the
	// requested resourceVersion too old; answer 410 Expired locally.
	ReasonStaleResourceVersion Reason = "StaleResourceVersion"

	// reasonAllowed is the Stats key for decisions with no Reason.
	reasonAllowed Reason = "Allowed"
)

// TooManyWatchesRetryAfter is the RetryAfter of a TooManyWatches decision.
// Nothing tells the engine when one of the identity's watches will end (a
// server-side timeout is minutes away, a client may close one any moment),
// so this is a short, fixed figure: long enough that a client honouring it
// does not spin, short enough that it gets a slot soon after one frees.
const TooManyWatchesRetryAfter = 2 * time.Second

// Decision is the engine's answer to one request.
type Decision struct {
	// Allowed says whether to forward the request.
	Allowed bool
	// Reason is why it was (or, in DryRun, would have been) rejected; ""
	// when fine.
	Reason Reason
	// RetryAfter is > 0 when Reason is set, except for
	// StaleResourceVersion, where it is 0 (the client must relist, not
	// wait).
	RetryAfter time.Duration
	// Budget names the governing budget; "" when none matched, and then the
	// request has no limits.
	Budget string
	// Enforcement is the governing budget's ("" when none).
	Enforcement Enforcement
	// DryRun is true when Reason is set but the request is allowed because
	// the budget is DryRun.
	DryRun bool
	// Watch is the concurrency slot of an admitted watch; pass it to
	// Engine.WatchEnded when the watch ends. It is the zero Watch for
	// lists, rejected requests, exempt budgets and requests no budget
	// governs.
	Watch Watch
}

// Watch is an admitted watch's slot. Release it with Engine.WatchEnded
// exactly once; releasing it again (or releasing the zero Watch) does
// nothing, so a proxy may release from several paths without coordination.
type Watch struct {
	slot *slot
	gen  uint64
	id   *identity
	key  watchKey
}

// Valid reports whether w holds a slot (the zero Watch holds none).
func (w Watch) Valid() bool { return w.slot != nil }

// slot makes release idempotent: a Watch remembers the generation its slot
// had when admitted, and the first release advances it, so later releases
// of that Watch (even after the slot was recycled for another watch) find a
// different generation and do nothing. Slots are pooled so that admitting
// a watch does not allocate.
type slot struct {
	gen atomic.Uint64
}

var slots = sync.Pool{New: func() any { return new(slot) }}

// Outcome is how a watch ended.
type Outcome uint8

const (
	// OutcomeClosed: the stream ended normally (server timeout, client went
	// away).
	OutcomeClosed Outcome = iota + 1
	// OutcomeError: the stream ended with an ERROR event, a transport
	// error, or a non-200 answer other than OutcomeDenied's.
	OutcomeError
	// OutcomeDenied: the API server refused the caller (401 or 403). The
	// caller's rights, not the watch, are at fault: it is neither a
	// failure nor a success, and nothing is remembered for its key.
	OutcomeDenied
)
