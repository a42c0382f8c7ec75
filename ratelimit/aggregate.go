package ratelimit

import "hash/maphash"

// Aggregate is a hierarchical budget's upper level: it bounds the sum of
// what one impersonating caller opens on behalf of others, whoever it
// names. The budget that governs the caller's own, direct requests for a
// resource carries it; each impersonated watch is charged to the
// impersonated user's identity under the budget that governs it (its own
// buckets and cap, as always) and to the caller's aggregate. So made-up
// impersonated names, each a fresh identity with fresh buckets, cannot
// multiply what one caller may open: the caller, who cannot change who it
// is, pays for all of them together.
//
// The zero Aggregate bounds nothing.
type Aggregate struct {
	// WatchOpensPerMinute refills the caller's aggregate watch bucket; 0
	// means its opens are not bounded in sum.
	WatchOpensPerMinute int32
	// WatchBurst is the aggregate bucket's size; at least 1 when opens are
	// bounded. Every impersonated watch takes 1 token from it, whatever it
	// asks for (the impersonated identity's own bucket prices initial
	// state).
	WatchBurst int32
	// MaxConcurrentWatches caps the watches the caller holds open for
	// others at once (per proxy replica); 0 means no cap.
	MaxConcurrentWatches int32
}

// enabled reports whether a bounds anything.
func (a Aggregate) enabled() bool { return a.WatchOpensPerMinute > 0 || a.MaxConcurrentWatches > 0 }

// aggregateFor returns the budget state and compiled budget whose
// Aggregate an impersonated watch r is charged to: the budget that governs
// r's caller itself (a direct request for the same resource), when it has
// an Aggregate and is not Exempt. Nil otherwise.
func (a *enforced) aggregateFor(r *Request) (*budgetState, *Budget) {
	if !r.Impersonated || r.Verb != VerbWatch || r.Caller == "" {
		return nil, nil
	}
	j := a.policy.matchRequest(r.Caller, r.CallerGroups, r.Group, r.Resource, r.Namespace, false)
	if j < 0 {
		return nil, nil
	}
	bs := a.states[j]
	cfg := bs.cfg.Load()
	if cfg.Enforcement == Exempt || !cfg.Aggregate.enabled() {
		return nil, nil
	}
	return bs, cfg
}

// aggregateIdentity finds or tracks caller's aggregate identity in bs, and
// returns it with its shard locked. At MaxTrackedKeys the callers that are
// not yet tracked share the budget's aggregate overflow identity.
func (e *Engine) aggregateIdentity(bs *budgetState, caller string) *identity {
	h := maphash.String(e.userSeed, caller)
	return e.lockedIdentity(&bs.aggregates[h%numShards], &bs.aggregateOverflow, h, e.userKey(caller))
}

// chargeAggregate charges one watch to the aggregate identity id under cfg
// at now (UnixNano): it takes a token and a slot when both are there, and
// otherwise changes nothing and returns ReasonAggregateLimited with how
// long to wait. id.sh.mu is held.
func (e *Engine) chargeAggregate(id *identity, now int64, cfg *Budget) (Reason, Decision) {
	now = id.clock(now)
	id.touch(now)
	if id.cfg != cfg {
		id.cfg = cfg
		rebucket(&id.watch, now, float64(cfg.Aggregate.WatchOpensPerMinute), cfg.Aggregate.WatchBurst)
	}
	if c := cfg.Aggregate.MaxConcurrentWatches; c > 0 && id.open >= c {
		id.rejections++
		return ReasonAggregateLimited, Decision{RetryAfter: TooManyWatchesRetryAfter}
	}
	if id.watch.limited() && !id.watch.allowN(now, 1) {
		id.rejections++
		return ReasonAggregateLimited, Decision{RetryAfter: tokenWait(&id.watch, now, 1)}
	}
	id.open++
	id.sh.open++
	return ReasonNone, Decision{}
}

// refundAggregate gives back the token and slot chargeAggregate took, for
// a watch its own identity's budget then rejected, or that was not
// forwarded.
func (e *Engine) refundAggregate(id *identity) {
	sh := id.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	id.open--
	sh.open--
	if id.watch.limited() {
		id.watch.giveBack(1)
	}
}

// releaseAggregate gives back the slot of an admitted watch that ended, at
// now (UnixNano).
func releaseAggregate(id *identity, now int64) {
	sh := id.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	id.open--
	sh.open--
	id.touch(now)
}
