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
// keeps no reference to a Request: it copies the user name of an identity
// it tracks and stores everything else as hashes or numbers. (The Watch of
// an admitted watch refers to its group, resource, namespace and
// selectors until the caller drops it.)
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
	// ResourceVersionMatch and SendInitialEvents are the watch's query
	// parameters as kube-apiserver reads them (metav1.ListOptions):
	// SendInitialEvents is nil when absent. They say whether the watch
	// asks for the current state first (initialState) and whether the API
	// server answers a too old version with 410 Expired (fromVersion).
	ResourceVersionMatch string
	SendInitialEvents    *bool
	// Continuation is true for a list that continues an earlier one (its
	// query has a continue token): a further page of the same list.
	Continuation bool
	// QueryRefused is true when the API server refuses the request's
	// query with 400 before its version matters (a selector or number
	// that does not parse): it is never answered stale locally.
	QueryRefused bool
	// Impersonated is true when User and Groups are an identity the caller
	// impersonates (and may), false when they are the caller's own.
	Impersonated bool
	// Caller and CallerGroups are the authenticated caller behind an
	// impersonated request, whose Aggregate it is also charged to; unset
	// for a direct one.
	Caller       string
	CallerGroups []string
}

// initialState reports whether the watch asks the server for the current
// state first, which costs the server a LIST: sendInitialEvents=true, or
// no sendInitialEvents and a version "" or "0". A watch with
// sendInitialEvents=false starts from its version, or from now, without
// the state.
func (r *Request) initialState() bool {
	if r.SendInitialEvents != nil {
		return *r.SendInitialEvents
	}
	return r.ResourceVersion == "" || r.ResourceVersion == "0"
}

// fromVersion reports whether the watch is one kube-apiserver answers 410
// Expired, in the stream, when its version is too old, whatever the API
// server's configuration: a watch without sendInitialEvents and
// resourceVersionMatch. Only such a watch is answered locally from the
// stale memory. The API server serves a watch-list (sendInitialEvents=true,
// resourceVersionMatch=NotOlderThan) from its watch cache whatever the
// version, and from etcd it answers 410; sendInitialEvents=false with
// NotOlderThan is answered 410 where the WatchList feature is on and 422
// where it is off; every other combination gets 422, and a query that does
// not decode 400. Those go to the API server.
func (r *Request) fromVersion() bool {
	return r.SendInitialEvents == nil && r.ResourceVersionMatch == "" && !r.QueryRefused
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
	// requested resourceVersion too old; answer 410 Expired locally, after
	// holding the answer back for RetryAfter.
	ReasonStaleResourceVersion Reason = "StaleResourceVersion"
	// ReasonAggregateLimited: the impersonating caller's Aggregate (the
	// sum of what it opens for others) lacks the token or the slot;
	// RetryAfter is the time until the token is there, or
	// TooManyWatchesRetryAfter. The Decision's Budget is the one that
	// carries the Aggregate.
	ReasonAggregateLimited Reason = "AggregateLimited"
	// ReasonWatchListIncomplete: the identity's last
	// IncompleteWatchListLimit watch-lists of this resource ended without
	// the bookmark that ends their initial events; its watch-lists of the
	// resource are refused until RetryAfter has passed (see
	// Engine.WatchListEnded). The proxy answers as an API server without
	// watch-list support, so that the client lists and watches instead.
	ReasonWatchListIncomplete Reason = "WatchListIncomplete"
	// ReasonResourceListsLimited: the identity's rebuild bucket for this
	// resource (Limits.ListsPerMinutePerResource) lacks the token;
	// RetryAfter is the time until it holds it.
	ReasonResourceListsLimited Reason = "ResourceListsLimited"

	// ReasonAllowed is not a Decision's Reason: it is the key under which
	// BudgetStats.Decisions counts decisions with no Reason.
	ReasonAllowed Reason = "Allowed"
)

// reasonTexts says, in a few words, why a request was rejected.
var reasonTexts = map[Reason]string{
	ReasonRateLimited:          "too many watch or list requests",
	ReasonTooManyWatches:       "too many open watches",
	ReasonBackingOff:           "watches keep failing, backing off",
	ReasonStaleResourceVersion: "resubscribing with a resourceVersion the API server declared too old",
	ReasonAggregateLimited:     "too many watches opened on behalf of others by the impersonating caller",
	ReasonResourceListsLimited: "too many lists of this resource",
	ReasonWatchListIncomplete:  "watch-lists of this resource keep ending without the bookmark that ends their initial events; list, then watch",
}

// Text says, in a few words, why a request was rejected for reason r (the
// reason itself when it is not one of the engine's): the start of a 429's
// message and the note of the budget's Event, so that the client and the
// operator read the same words.
func (r Reason) Text() string {
	if t, ok := reasonTexts[r]; ok {
		return t
	}
	return string(r)
}

// StaleRepeatHold is the least RetryAfter of a stale answer that repeats
// one: an Enforce budget answers a watch ReasonStaleResourceVersion with
// RetryAfter 0 the first time, and at least StaleRepeatHold when the same
// identity was answered stale for the same watch key within
// staleRepeatWindow before (with Backoff enabled, the hold also grows with
// the key's backoff). The answer is the API server's own, so holding it back
// is the only way to keep a client that loops on a stale version from
// looping faster through watchgate than directly.
const StaleRepeatHold = time.Second

// staleRepeatWindow is how long after a stale answer another one for the
// same identity and watch key counts as a repeat. A client that resyncs
// after "too old" does not come back with a stale version; one that does
// within a minute is looping.
const staleRepeatWindow = time.Minute

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
	// RetryAfter is how long the client should wait: > 0 when Reason is
	// set, except for StaleResourceVersion. For StaleResourceVersion it is
	// how long to hold the local 410 answer back before sending it (the
	// client must relist, not retry the same version): 0 for the first
	// stale answer, at least StaleRepeatHold for a repeat, and in DryRun
	// always 0. Callers cap it (the proxy at its MaxRejectDelay).
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
	// agg is the impersonating caller's aggregate identity the watch is
	// also charged to; nil when none.
	agg *identity
}

// Valid reports whether w holds a slot (the zero Watch holds none).
func (w Watch) Valid() bool { return w.slot != nil }

// slot makes release idempotent: a Watch remembers the generation its slot
// had when admitted, and the first release advances it, so later releases
// of that Watch (even after the slot was recycled for another watch) find a
// different generation and do nothing. Slots are pooled so that admitting
// a watch does not allocate.
//
// While its watch is open a slot is also the engine's record of it: linked
// into its identity's open watches (identity.watches), with what matching
// the request needs, so that a policy swap can move it to the budget that
// governs it then (Engine.regovern). owner is its identity; it changes
// only with both shards' locks held, and is read with lockOwner.
type slot struct {
	gen atomic.Uint64

	owner      atomic.Pointer[identity]
	prev, next *slot // guarded by owner's shard lock
	// user, groups and impersonated are the request's, for matching; req
	// is its watch key as sent: the engine stores its hash (watchKey),
	// and computes it only when the watch's end changes backoff. They
	// refer to the request's strings until the watch ends.
	user         string
	groups       []string
	impersonated bool
	req          requestKey
	// charged is what admitting the watch took from its identity's
	// buckets, given back when it is not forwarded.
	charged charge
}

// release drops what the slot refers to, before it goes back to the pool.
func (s *slot) release() {
	s.owner.Store(nil)
	s.prev, s.next = nil, nil
	s.user, s.groups, s.impersonated, s.req, s.charged = "", nil, false, requestKey{}, charge{}
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
	// OutcomeNotForwarded: the watch was admitted but never reached the
	// API server (the proxy's own guard refused it). Its slot is released
	// and the tokens admitting it took are given back (see charge);
	// nothing is remembered for its key.
	OutcomeNotForwarded
	// OutcomeThrottled: the API server answered 429 (its own flow
	// control, or a consistent list its watch cache could not serve in
	// time) and told the client when to come back (Retry-After). The
	// API server, not the watch, is at fault, and it already paces the
	// client: nothing is remembered for the key, so that watchgate never
	// adds its own delay to the API server's.
	OutcomeThrottled
)
