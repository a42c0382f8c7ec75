package ratelimit

import (
	"hash/maphash"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure an Engine. The zero value is usable.
//
// The caps bound the engine's memory in bytes whatever clients send: an
// identity keeps a copy of at most 512 bytes of its user name and
// fixed-size buckets, a backoff
// key is a 128-bit hash of the watch key (never the client's strings), a
// stale version a parsed number. The Memory benchmarks (bench_test.go)
// measure the bytes per key, so the worst case is MaxTrackedKeys·(B/identity) +
// MaxBackoffKeys·(B/backoff key) + the stale-version caps.
type Options struct {
	// MaxTrackedKeys caps the identities the engine tracks (one per
	// budget × user). Default 1<<20. Backoff keys do not count against it
	// (see MaxBackoffKeys), so no identity's failures can push another
	// identity out. At the cap, identities take about 328 MiB
	// (BenchmarkIdentityMemory; 64 bytes of each are its observed peaks,
	// see ObservedPeaks), plus at most one overflow backoff key each, and
	// for an identity that rebuilds under ListsPerMinutePerResource its
	// rebuild buckets (resourcelists.go, about 350 bytes).
	//
	// At the cap a new identity is governed by its budget's shared
	// overflow identity: every user that arrives while the engine is full
	// shares one set of buckets and one concurrency cap, as if they were
	// one user — strict for them, never unlimited for the API server.
	// Sweep frees identities, and new ones are then tracked again.
	MaxTrackedKeys int
	// MaxBackoffKeys caps the backoff keys (identity × watch key that
	// failed or was answered stale) the engine tracks in all. Default
	// 1<<18 (about 21 MiB, BenchmarkBackoffKeyMemory): a key exists only while its
	// watches fail. At the cap a failing key that is not yet tracked is kept in
	// its identity's overflow key (see MaxBackoffKeysPerIdentity): it
	// still backs off, together with the identity's other untracked keys.
	MaxBackoffKeys int
	// MaxBackoffKeysPerIdentity caps the backoff keys one identity tracks.
	// Default 64: a client rarely watches more than a few dozen distinct
	// (resource, namespace, selector) keys, and one that fails on more is
	// misbehaving. Beyond it every further failing key of the identity
	// shares one per-identity overflow key, and a watch whose key is not
	// tracked is governed by it: the identity stays throttled, as one key.
	MaxBackoffKeysPerIdentity int
	// IdleAfter is how long state must go untouched before Sweep may evict
	// it. Default 10m.
	IdleAfter time.Duration
	// Seed seeds the backoff jitter, for reproducible tests; 0 means
	// random.
	Seed uint64
	// OnThrottled, when set, is called (outside engine locks, on the
	// deciding goroutine) at most once per budget × identity per
	// ThrottleNotifyInterval when that identity gets a non-empty Reason
	// (also in DryRun). It must not block; it is where the proxy logs and
	// records events without turning a storm into a log storm.
	OnThrottled func(budget, user string, reason Reason, dryRun bool)
	// ThrottleNotifyInterval: default 1m.
	ThrottleNotifyInterval time.Duration
}

const (
	defaultMaxTrackedKeys            = 1 << 20
	defaultMaxBackoffKeys            = 1 << 18
	defaultMaxBackoffKeysPerIdentity = 64
	defaultIdleAfter                 = 10 * time.Minute
	defaultThrottleNotifyInterval    = time.Minute
	// defaultJitter is the fraction of a backoff delay drawn at random.
	defaultJitter = 0.2
)

// Engine decides, per request, whether to admit it, why not, and for how
// long the client should wait; and it learns from how each admitted watch
// ended. Its rules come from a Policy (SetPolicy); with none, or when no
// budget matches, everything is allowed.
//
// Engine has four main methods. Decide answers a request. WatchEnded
// releases an admitted watch's slot and feeds backoff. StaleVersionSeen
// teaches it a resourceVersion the API server declared too old. Sweep,
// called periodically, evicts idle state.
//
// Per budget and identity (user name) the engine keeps:
//   - a watch bucket (bucket: rate.Limiter's arithmetic) of
//     Limits.WatchBurst tokens refilled at
//     WatchOpensPerMinute; a watch takes 1 token, or InitialStateCost when
//     it asks for initial state (no resourceVersion, "0", or
//     sendInitialEvents), since that costs the server a LIST;
//   - an optional list bucket (ListsPerMinute, ListBurst);
//   - a count of open watches, capped at MaxConcurrentWatches;
//   - backoff per watch key (group, resource, namespace, label and field
//     selector, kept as a 128-bit hash), at most
//     Options.MaxBackoffKeysPerIdentity keys: see WatchEnded;
//   - its observed peaks, fixed-size, for the budget's ObservedPeaks (see
//     Stats and Suggest); they change no decision.
//
// Engine-wide it remembers stale resourceVersions per (group, resource):
// each reported version, and the highest one as a "too old" watermark (see
// StaleMatch).
//
// When several checks would reject a watch, the first in this order is the
// Reason: a watch-list refused for its resource (watchlists.go), stale
// version (it never reaches the server, so nothing else matters), backoff,
// concurrency, its resource's rebuilds (resourcelists.go), tokens; for a
// list: its resource's rebuilds, then the list bucket. A rejected request takes no
// tokens and no slot. A stale-version rejection counts as a failed watch of
// its key (with Backoff enabled), and its RetryAfter says how long to hold
// the local answer back: 0 the first time, at least StaleRepeatHold for a
// repeat whatever the budget's Backoff, more while the key backs off (see
// staleHold). A DryRun budget reports the same Reason but allows the
// request: the watch takes a slot (it is open, after all) but no
// tokens, so the figures reported are what Enforce would have done. An
// Exempt budget allows without tracking anything.
//
// Every method takes the current time; callers pass time.Now(), tests pass
// fixed instants. Instants may arrive slightly out of order from concurrent
// callers: an identity's buckets never run backwards.
//
// Engine is safe for simultaneous use by multiple goroutines. Decide and
// WatchEnded take one lock, that of the identity's shard (one of 64 per
// budget), and read the Policy through an atomic pointer; an impersonated
// watch charged to its caller's Aggregate takes the aggregate's shard lock
// too, never while holding the other.
type Engine struct {
	opts Options
	// userSeed hashes user names to shards; seeds hash watch keys.
	userSeed   maphash.Seed
	seeds      keySeeds
	jitterSeed uint64

	current atomic.Pointer[enforced]
	// shares are this replica's fractions of the budgets (SetShares).
	shares atomic.Pointer[sharesGen]
	// demandMu guards demandAt, the instant of the last Demand.
	demandMu sync.Mutex
	demandAt time.Time
	// swapMu serialises SetPolicy.
	swapMu sync.Mutex
	// orphans are removed budgets whose identities still hold open
	// watches that no budget governs (see remove). Guarded by swapMu.
	orphans []*budgetState
	// identities and backoffKeys count what is tracked, for
	// MaxTrackedKeys and MaxBackoffKeys.
	identities, backoffKeys keyCap
	stale                   staleMemory
	// watchLists remembers incomplete watch-lists (watchlists.go).
	watchLists watchListMemory

	// The following are used for testing purposes.
	//
	// jitter is the fraction of a backoff delay drawn at random, in [0, 1).
	jitter float64
}

// enforced is a policy with the state of each of its budgets.
type enforced struct {
	policy *Policy
	// states[i] belongs to policy.budgets[i].
	states []*budgetState
}

// NewEngine returns an Engine with an empty Policy.
func NewEngine(opts Options) *Engine {
	if opts.MaxTrackedKeys <= 0 {
		opts.MaxTrackedKeys = defaultMaxTrackedKeys
	}
	if opts.MaxBackoffKeys <= 0 {
		opts.MaxBackoffKeys = defaultMaxBackoffKeys
	}
	if opts.MaxBackoffKeysPerIdentity <= 0 {
		opts.MaxBackoffKeysPerIdentity = defaultMaxBackoffKeysPerIdentity
	}
	if opts.IdleAfter <= 0 {
		opts.IdleAfter = defaultIdleAfter
	}
	if opts.ThrottleNotifyInterval <= 0 {
		opts.ThrottleNotifyInterval = defaultThrottleNotifyInterval
	}
	e := &Engine{opts: opts, userSeed: maphash.MakeSeed(), seeds: newKeySeeds(), jitterSeed: opts.Seed, jitter: defaultJitter}
	if e.jitterSeed == 0 {
		e.jitterSeed = rand.Uint64()
	}
	e.identities.max = int64(opts.MaxTrackedKeys)
	e.backoffKeys.max = int64(opts.MaxBackoffKeys)
	e.stale.init()
	e.watchLists.init()
	e.current.Store(&enforced{policy: &Policy{}})
	e.shares.Store(&sharesGen{})
	return e
}

// Policy returns the current policy.
func (e *Engine) Policy() *Policy { return e.current.Load().policy }

// SetPolicy makes p the current policy (nil means an empty one). State is
// kept per budget name: a budget that stays keeps every identity's buckets
// (reconfigured at now as rate.Limiter's SetLimitAt and SetBurstAt do, so
// accrued tokens survive a budget edit), open-watch counts and backoff. A
// budget that goes frees its state.
//
// An open watch counts against the budget that governs it now: every open
// watch whose governing budget changes with p (its budget went, was
// re-created, or another budget now ranks first for it) moves, with its
// count, to its identity under the budget that governs it in p, so that a
// budget deleted and re-created, or a new budget that takes an identity
// over, still sees the watches the identity holds. A watch that p leaves
// ungoverned, or governs with an Exempt budget, stays where it was until
// it ends. Aggregates count only the watches charged to them (see
// Aggregate). Decisions already under way finish under the old policy.
func (e *Engine) SetPolicy(now time.Time, p *Policy) {
	if p == nil {
		p = &Policy{}
	}
	e.swapMu.Lock()
	defer e.swapMu.Unlock()

	old := e.current.Load()
	byName := make(map[string]*budgetState, len(old.states))
	for _, bs := range old.states {
		byName[bs.name] = bs
	}
	next := &enforced{policy: p, states: make([]*budgetState, len(p.budgets))}
	var kept []*budgetState
	for i := range p.budgets {
		b := &p.budgets[i]
		if bs, ok := byName[b.Name]; ok {
			delete(byName, b.Name)
			bs.cfg.Store(b)
			next.states[i] = bs
			kept = append(kept, bs)
		} else {
			next.states[i] = newBudgetState(b, now)
		}
	}
	e.current.Store(next)

	for _, bs := range kept {
		e.reconfigure(bs, now)
	}
	for _, bs := range old.states {
		e.regovern(next, bs, now)
	}
	for _, bs := range e.orphans {
		e.regovern(next, bs, now)
	}
	for _, bs := range byName {
		e.remove(bs)
		e.orphans = append(e.orphans, bs)
	}
	e.dropOrphans()
}

// dropOrphans forgets the identities of removed budgets whose watches all
// ended, and the removed budgets left with none. swapMu is held.
func (e *Engine) dropOrphans() {
	kept := e.orphans[:0]
	for _, bs := range e.orphans {
		left := false
		for i := range bs.shards {
			sh := &bs.shards[i]
			sh.mu.Lock()
			e.identities.give(sh.evict(func(id *identity) bool { return id.watches == nil }))
			left = left || sh.tracked > 0
			sh.mu.Unlock()
		}
		bs.overflow.mu.Lock()
		left = left || bs.overflow.spill.watches != nil
		bs.overflow.mu.Unlock()
		if left {
			kept = append(kept, bs)
		}
	}
	clear(e.orphans[len(kept):])
	e.orphans = kept
}

// reconfigure applies the budget's current configuration to every
// identity's buckets at now, shard by shard. Identities it misses (created
// concurrently under the old configuration) are reconfigured on their next
// decision. It does not count as seeing the identities: a policy swap does
// not delay their eviction.
func (e *Engine) reconfigure(bs *budgetState, now time.Time) {
	cfg := bs.cfg.Load()
	gen := e.shares.Load().gen
	apply := func(id *identity) {
		if id.cfg != cfg || id.shareGen != gen {
			e.configure(id, id.clock(now.UnixNano()), cfg)
		}
	}
	for i := range bs.shards {
		sh := &bs.shards[i]
		sh.mu.Lock()
		sh.each(apply)
		sh.mu.Unlock()
	}
	bs.overflow.mu.Lock()
	apply(bs.overflow.spill)
	bs.overflow.mu.Unlock()
}

// remove frees a dropped budget's state and gives its keys back, but for
// the identities that still hold open watches no budget took over (see
// regovern): the budget is then an orphan, kept (Engine.orphans) so that
// a later policy that governs those watches again counts them.
func (e *Engine) remove(bs *budgetState) {
	bs.removed.Store(true)
	for i := range bs.shards {
		sh := &bs.shards[i]
		sh.mu.Lock()
		sh.each(e.dropBackoff)
		e.identities.give(sh.evict(func(id *identity) bool { return id.watches == nil }))
		sh.mu.Unlock()
	}
	sh := &bs.overflow
	sh.mu.Lock()
	e.dropBackoff(sh.spill)
	sh.mu.Unlock()
	for i := range bs.aggregates {
		sh := &bs.aggregates[i]
		sh.mu.Lock()
		e.identities.give(sh.tracked)
		sh.ids, sh.tracked = nil, 0
		sh.mu.Unlock()
	}
}

// Decide answers r at now. See Engine for the checks and their order.
//
// An admitted watch's Decision carries a Watch: pass it to WatchEnded when
// the watch ends.
func (e *Engine) Decide(now time.Time, r *Request) Decision {
	a := e.current.Load()
	i := a.policy.matchRequest(r.User, r.Groups, r.Group, r.Resource, r.Namespace, r.Impersonated)
	if i < 0 {
		return Decision{Allowed: true}
	}
	bs := a.states[i]
	cfg := bs.cfg.Load()
	h := maphash.String(e.userSeed, r.User)
	sh := bs.shardFor(h)
	if cfg.Enforcement == Exempt {
		sh.exempt.Add(1)
		return Decision{Allowed: true, Budget: cfg.Name, Enforcement: cfg.Enforcement}
	}
	stale := r.Verb == VerbWatch && cfg.StaleVersions.Action == StaleReject && r.fromVersion() &&
		e.stale.has(now, r.Group, r.Resource, r.ResourceVersion, &cfg.StaleVersions)

	// An impersonated watch is charged to its caller's Aggregate first:
	// beyond it, the impersonated identity is not asked (and nothing of it
	// is taken); otherwise the charge is refunded if the identity's own
	// budget then rejects the watch.
	var agg *identity
	aggDryRun := false
	if aggBS, aggCfg := a.aggregateFor(r); aggBS != nil && !stale {
		agg = e.aggregateIdentity(aggBS, r.Caller)
		reason, d := e.chargeAggregate(agg, now.UnixNano(), aggCfg)
		if reason != ReasonNone {
			agg.sh.decisions[reasonIndex(reason)]++
		}
		agg.sh.mu.Unlock()
		if reason != ReasonNone {
			agg = nil
			if aggCfg.Enforcement != DryRun {
				return Decision{Reason: reason, RetryAfter: d.RetryAfter, Budget: aggCfg.Name, Enforcement: aggCfg.Enforcement}
			}
			aggDryRun = true
		}
	}

	id := e.lockedIdentity(sh, &bs.overflow, h, e.userKey(r.User))
	sh = id.sh
	v := e.decide(id, e.advance(id, now.UnixNano(), cfg), r, cfg, stale)
	var w Watch
	if v.admitted {
		w = e.watchOf(id, r)
		w.slot.charged = v.charged
	}
	sh.mu.Unlock()
	if agg != nil && !v.admitted {
		e.refundAggregate(agg)
		agg = nil
	}
	if aggDryRun && v.reason == ReasonNone {
		// The aggregate's DryRun budget would have rejected it.
		return Decision{Allowed: true, Reason: ReasonAggregateLimited, Budget: cfg.Name, Enforcement: cfg.Enforcement, DryRun: true,
			Watch: w}
	}

	// Built here, in the result, rather than filled in through a pointer
	// under the lock: a Decision is 176 bytes, a third of them strings.
	dryRun := v.reason != ReasonNone && cfg.Enforcement == DryRun
	if v.notify {
		e.opts.OnThrottled(cfg.Name, r.User, v.reason, dryRun)
	}
	if v.admitted {
		w.agg = agg
		return Decision{
			Allowed: true, Reason: v.reason, RetryAfter: v.retryAfter,
			Budget: cfg.Name, Enforcement: cfg.Enforcement, DryRun: dryRun,
			Watch: w,
		}
	}
	return Decision{
		Allowed: v.reason == ReasonNone || dryRun, Reason: v.reason, RetryAfter: v.retryAfter,
		Budget: cfg.Name, Enforcement: cfg.Enforcement, DryRun: dryRun,
	}
}

// watchOf is the Watch of r, admitted for id: a slot that remembers what
// matching r needs, linked into id's open watches. id.sh.mu is held.
func (e *Engine) watchOf(id *identity, r *Request) Watch {
	s := slots.Get().(*slot)
	// The name kept bounded (userKey), which matches as the name does:
	// subjects are far shorter than the part it keeps.
	user := id.user
	if id == id.sh.spill {
		user = e.userKey(r.User)
	}
	s.user, s.groups, s.impersonated, s.req = user, r.Groups, r.Impersonated, requestKeyOf(r)
	id.link(s)
	return Watch{slot: s, gen: s.gen.Load()}
}

// verdict is decide's answer.
type verdict struct {
	reason     Reason
	retryAfter time.Duration
	// admitted: a watch was allowed and counted as open; it needs a slot.
	admitted bool
	// charged: what admitting it took (checkWatch).
	charged charge
	// notify: call OnThrottled.
	notify bool
}

// decide decides r for id at now (UnixNano) under cfg (stale: r asks for
// a version the stale memory holds), counts the decision and an admitted
// watch, and reports whether to call OnThrottled. id.sh.mu is held.
func (e *Engine) decide(id *identity, now int64, r *Request, cfg *Budget, stale bool) (v verdict) {
	watch := r.Verb == VerbWatch
	var heldWatchList time.Duration
	if watch && e.watchLists.tracked.Load() > 0 {
		heldWatchList = e.watchListHeld(now, r)
	}
	switch {
	case heldWatchList > 0:
		v.reason, v.retryAfter = ReasonWatchListIncomplete, heldWatchList
	case stale:
		v.reason = ReasonStaleResourceVersion
		if cfg.Enforcement != DryRun {
			req := requestKeyOf(r)
			v.retryAfter = e.staleHold(id, &req, time.Unix(0, now), cfg.Backoff)
		}
	case watch:
		v.reason, v.retryAfter, v.charged = e.checkWatch(id, now, r, cfg)
	case r.Verb == VerbList && cfg.Limits.ListsPerMinutePerResource > 0:
		v.reason, v.retryAfter = e.checkList(id, now, r, cfg)
	case r.Verb == VerbList && id.list.limited() && !id.list.allowN(now, 1):
		v.reason, v.retryAfter = ReasonRateLimited, tokenWait(&id.list, now, 1)
	}
	sh := id.sh
	if watch && (v.reason == ReasonNone || cfg.Enforcement == DryRun) {
		v.admitted = true
		id.open++
		if id.opens != math.MaxUint32 {
			id.opens++
		}
		sh.open++
	}
	if id.observes() {
		e.observe(id, now, r, stale, v)
	}
	sh.decisions[reasonIndex(v.reason)]++
	if v.reason == ReasonNone {
		return v
	}
	id.rejections++
	if e.opts.OnThrottled != nil && (id.notified == 0 || now-id.notified >= int64(e.opts.ThrottleNotifyInterval)) {
		id.notified = now
		v.notify = true
	}
	return v
}

// checkWatch runs the checks after the stale version on a watch, in order,
// at now (UnixNano), and takes its tokens when they all pass, saying which.
// id.sh.mu is held.
func (e *Engine) checkWatch(id *identity, now int64, r *Request, cfg *Budget) (Reason, time.Duration, charge) {
	id.asked = saturatingInc(id.asked)
	if len(id.backoff) > 0 {
		req := requestKeyOf(r)
		if _, st, ok := id.lookup(e.seeds.watchKeyOf(&req)); ok {
			if wait := st.until - now; wait > 0 {
				return ReasonBackingOff, time.Duration(wait), charge{}
			}
		}
	}
	if c := id.maxOpen; c > 0 && id.open >= c {
		id.capped = saturatingInc(id.capped)
		return ReasonTooManyWatches, TooManyWatchesRetryAfter, charge{}
	}
	var rb *bucket
	if cfg.Limits.ListsPerMinutePerResource > 0 {
		rb = e.rebuildBucket(id, now, r, cfg)
		if reason, d := checkRebuild(rb, now); reason != ReasonNone {
			return reason, d, charge{}
		}
	}
	var c charge
	if id.watch.limited() {
		n := 1
		if r.initialState() {
			n = min(int(cfg.Limits.InitialStateCost), id.watch.burst)
		}
		if !id.watch.allowN(now, n) {
			return ReasonRateLimited, tokenWait(&id.watch, now, n), charge{}
		}
		c.tokens = int32(n)
	}
	if rb != nil {
		rb.allowN(now, 1)
		c.rebuild = chargedResource
		if rb == &id.resLists.overflow {
			c.rebuild = chargedOverflow
		}
	}
	return ReasonNone, 0, c
}

// WatchEnded releases w's slot and learns from how the watch ended, after
// lifetime, with outcome. Releasing the zero Watch, or a Watch already
// released, does nothing, so it is safe to call from every path that may
// end a watch.
//
// With the budget's Backoff enabled, for the watch's key:
//   - a watch that lived at least ResetAfter clears the backoff, however it
//     ended (a long-lived watch that finally errors, typically 410 after a
//     compaction, is healthy); with ResetAfter 0, any non-failure clears it;
//   - otherwise a watch that ended with OutcomeError, or sooner than
//     ShortWatch, is a failure: the n-th consecutive failure rejects the
//     key's watches with ReasonBackingOff for
//     max(Initial, d − 0.2·u·d), d = min(Max, Initial·2^(n-1)), u uniform
//     in [0, 1) — always within [Initial, Max]. With Initial 1s, Max 5m,
//     a client whose watches die within a second waits about 1s, 2s, 4s,
//     … then 5m. Only a watch opened at or after the key's delay ran out
//     counts: watches that were open when the key last failed fail in the
//     same event (many watches of one key, or of an identity's untracked
//     keys, when the API server restarts), and count once;
//   - otherwise, and always after OutcomeDenied, OutcomeNotForwarded or
//     OutcomeThrottled, nothing changes.
//
// Beyond Options.MaxBackoffKeysPerIdentity (or MaxBackoffKeys) a failing
// key's backoff is kept in the identity's overflow key, shared by all its
// untracked keys. Watches of the overflow identity learn nothing.
func (e *Engine) WatchEnded(now time.Time, w Watch, lifetime time.Duration, outcome Outcome) {
	if w.slot == nil || !w.slot.gen.CompareAndSwap(w.gen, w.gen+1) {
		return
	}
	s := w.slot
	id := lockOwner(s)
	sh := id.sh
	id.unlink(s)
	id.open--
	sh.open--
	id.touch(now.UnixNano())
	if outcome == OutcomeNotForwarded {
		e.giveBack(id, s)
	}
	if id != sh.spill && !sh.bs.removed.Load() {
		e.learn(id, &s.req, now, lifetime, outcome, sh.bs.cfg.Load().Backoff)
	}
	sh.mu.Unlock()
	s.release()
	slots.Put(s)
	switch {
	case w.agg != nil && outcome == OutcomeNotForwarded:
		e.refundAggregate(w.agg)
	case w.agg != nil:
		releaseAggregate(w.agg, now.UnixNano())
	}
}

// Reasons are counted per shard at these indexes.
const (
	idxAllowed = iota
	idxRateLimited
	idxTooManyWatches
	idxBackingOff
	idxStale
	idxAggregateLimited
	idxWatchListIncomplete
	idxResourceListsLimited
	numReasons
)

var reasonsByIndex = [numReasons]Reason{ReasonAllowed, ReasonRateLimited, ReasonTooManyWatches, ReasonBackingOff, ReasonStaleResourceVersion, ReasonAggregateLimited,
	ReasonWatchListIncomplete, ReasonResourceListsLimited}

func reasonIndex(r Reason) int {
	switch r {
	case ReasonRateLimited:
		return idxRateLimited
	case ReasonTooManyWatches:
		return idxTooManyWatches
	case ReasonBackingOff:
		return idxBackingOff
	case ReasonStaleResourceVersion:
		return idxStale
	case ReasonAggregateLimited:
		return idxAggregateLimited
	case ReasonWatchListIncomplete:
		return idxWatchListIncomplete
	case ReasonResourceListsLimited:
		return idxResourceListsLimited
	}
	return idxAllowed
}
