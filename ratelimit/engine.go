package ratelimit

import (
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure an Engine. The zero value is usable.
type Options struct {
	// MaxTrackedKeys caps the keys the engine tracks: identities (one per
	// budget × user) plus backoff keys (one per identity × watch key that
	// failed). Default 1<<20: a few hundred MiB at the worst (an identity
	// takes about 340 B, see BENCHMARKS.md).
	//
	// At the cap the engine stays within it and stays safe:
	//   - a new identity is governed by its budget's shared overflow
	//     identity: every user that arrives while the engine is full shares
	//     one set of buckets and one concurrency cap, as if they were one
	//     user — strict for them, never unlimited for the API server;
	//   - a failing watch key that is not yet tracked gets no backoff (the
	//     buckets still bound it).
	// Sweep frees keys, and new identities are then tracked again.
	MaxTrackedKeys int
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
	defaultMaxTrackedKeys         = 1 << 20
	defaultIdleAfter              = 10 * time.Minute
	defaultThrottleNotifyInterval = time.Minute
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
//   - a watch bucket (rate.Limiter) of Limits.WatchBurst tokens refilled at
//     WatchOpensPerMinute; a watch takes 1 token, or InitialStateCost when
//     it asks for initial state (no resourceVersion, "0", or
//     sendInitialEvents), since that costs the server a LIST;
//   - an optional list bucket (ListsPerMinute, ListBurst);
//   - a count of open watches, capped at MaxConcurrentWatches;
//   - backoff per watch key (group, resource, namespace, label and field
//     selector): see WatchEnded.
//
// Engine-wide it remembers stale resourceVersions per (group, resource).
//
// When several checks would reject a watch, the first in this order is the
// Reason: stale version (it never reaches the server, so nothing else
// matters), backoff, concurrency, tokens. A rejected request takes no
// tokens and no slot. A stale-version rejection counts as a failed watch of
// its key, and its RetryAfter is the backoff the key was already in: a
// client looping on a stale version is answered "too old" with a growing
// hold-back instead of at once (see staleAgain). A DryRun budget reports the same Reason but allows
// the request: the watch takes a slot (it is open, after all) but no
// tokens, so the figures reported are what Enforce would have done. An
// Exempt budget allows without tracking anything.
//
// Every method takes the current time; callers pass time.Now(), tests pass
// fixed instants. Instants may arrive slightly out of order from concurrent
// callers: an identity's buckets never run backwards.
//
// Engine is safe for simultaneous use by multiple goroutines. Decide and
// WatchEnded take one lock, that of the identity's shard (one of 64 per
// budget), and read the Policy through an atomic pointer.
type Engine struct {
	opts       Options
	hashSeed   maphash.Seed
	jitterSeed uint64

	active atomic.Pointer[active]
	// swapMu serialises SetPolicy.
	swapMu sync.Mutex
	// keys counts tracked identities and backoff keys, for MaxTrackedKeys.
	keys  atomic.Int64
	stale staleMemory

	// The following are used for testing purposes.
	//
	// jitter is the fraction of a backoff delay drawn at random, in [0, 1).
	jitter float64
}

// active is the current policy with the state of each of its budgets.
type active struct {
	policy *Policy
	// states[i] belongs to policy.budgets[i].
	states []*budgetState
}

// NewEngine returns an Engine with an empty Policy.
func NewEngine(opts Options) *Engine {
	if opts.MaxTrackedKeys <= 0 {
		opts.MaxTrackedKeys = defaultMaxTrackedKeys
	}
	if opts.IdleAfter <= 0 {
		opts.IdleAfter = defaultIdleAfter
	}
	if opts.ThrottleNotifyInterval <= 0 {
		opts.ThrottleNotifyInterval = defaultThrottleNotifyInterval
	}
	e := &Engine{opts: opts, hashSeed: maphash.MakeSeed(), jitterSeed: opts.Seed, jitter: defaultJitter}
	if e.jitterSeed == 0 {
		e.jitterSeed = rand.Uint64()
	}
	e.stale.init()
	e.active.Store(&active{policy: &Policy{}})
	return e
}

// Policy returns the current policy.
func (e *Engine) Policy() *Policy { return e.active.Load().policy }

// SetPolicy makes p the current policy (nil means an empty one). State is
// kept per budget name: a budget that stays keeps every identity's buckets
// (reconfigured at now with rate.Limiter's SetLimitAt and SetBurstAt, so
// accrued tokens survive a budget edit), open-watch counts and backoff. A
// budget that goes frees its state; its open watches may still be released.
// Decisions already under way finish under the old policy.
func (e *Engine) SetPolicy(now time.Time, p *Policy) {
	if p == nil {
		p = &Policy{}
	}
	e.swapMu.Lock()
	defer e.swapMu.Unlock()

	old := e.active.Load()
	byName := make(map[string]*budgetState, len(old.states))
	for _, bs := range old.states {
		byName[bs.name] = bs
	}
	next := &active{policy: p, states: make([]*budgetState, len(p.budgets))}
	var kept []*budgetState
	for i := range p.budgets {
		b := &p.budgets[i]
		if bs, ok := byName[b.Name]; ok {
			delete(byName, b.Name)
			bs.cfg.Store(b)
			next.states[i] = bs
			kept = append(kept, bs)
		} else {
			next.states[i] = newBudgetState(b, &e.keys)
		}
	}
	e.active.Store(next)

	for _, bs := range kept {
		bs.reconfigure(now)
	}
	for _, bs := range byName {
		bs.remove()
	}
}

// reconfigure applies the budget's current configuration to every
// identity's buckets at now, shard by shard. Identities it misses (created
// concurrently under the old configuration) are reconfigured on their next
// decision. It does not count as seeing the identities: a policy swap does
// not delay their eviction.
func (bs *budgetState) reconfigure(now time.Time) {
	cfg := bs.cfg.Load()
	apply := func(id *identity) {
		if id.cfg != cfg {
			id.configure(id.clock(now), cfg)
		}
	}
	for i := range bs.shards {
		sh := &bs.shards[i]
		sh.mu.Lock()
		for _, id := range sh.ids {
			apply(id)
		}
		sh.mu.Unlock()
	}
	bs.overflow.mu.Lock()
	apply(bs.overflow.spill)
	bs.overflow.mu.Unlock()
}

// remove frees a dropped budget's state and gives its keys back.
func (bs *budgetState) remove() {
	bs.removed.Store(true)
	for i := range bs.shards {
		sh := &bs.shards[i]
		sh.mu.Lock()
		bs.keys.Add(-sh.keys)
		sh.keys = 0
		sh.ids = nil
		sh.mu.Unlock()
	}
}

// Decide answers r at now. See Engine for the checks and their order.
//
// An admitted watch's Decision carries a Watch: pass it to WatchEnded when
// the watch ends.
func (e *Engine) Decide(now time.Time, r *Request) Decision {
	a := e.active.Load()
	i := a.policy.matchRequest(r.User, r.Groups, r.Group, r.Resource, r.Namespace, r.Impersonated)
	if i < 0 {
		return Decision{Allowed: true}
	}
	bs := a.states[i]
	cfg := bs.cfg.Load()
	d := Decision{Allowed: true, Budget: cfg.Name, Enforcement: cfg.Enforcement}
	sh := bs.shardFor(e.hashSeed, r.User)
	if cfg.Enforcement == Exempt {
		sh.exempt.Add(1)
		return d
	}

	watch := r.Verb == VerbWatch
	if watch && cfg.StaleVersions.Action == StaleReject &&
		e.stale.has(now, r.Group, r.Resource, r.ResourceVersion, cfg.StaleVersions.Memory) {
		d.Reason = ReasonStaleResourceVersion
	}

	id, now := e.acquire(sh, r.User, cfg, now)
	sh = id.sh
	if d.Reason == ReasonStaleResourceVersion && cfg.Enforcement != DryRun {
		d.RetryAfter = e.staleAgain(id, keyOf(r), now, cfg.Backoff)
	}
	if d.Reason == ReasonNone {
		if watch {
			d.Reason, d.RetryAfter = id.checkWatch(now, r, cfg)
		} else if r.Verb == VerbList && id.list != nil && !id.list.AllowN(now, 1) {
			d.Reason, d.RetryAfter = ReasonRateLimited, tokenWait(id.list, now, 1)
		}
	}
	if d.Reason != ReasonNone && cfg.Enforcement == DryRun {
		d.DryRun = true
	} else if d.Reason != ReasonNone {
		d.Allowed = false
	}
	if d.Allowed && watch {
		s := slots.Get().(*slot)
		d.Watch = Watch{slot: s, gen: s.gen.Load(), id: id, key: keyOf(r)}
		id.open++
		sh.open++
	}

	notify := false
	if d.Reason != ReasonNone {
		id.rejections++
		ns := now.UnixNano()
		if e.opts.OnThrottled != nil && (id.notified == 0 || ns-id.notified >= int64(e.opts.ThrottleNotifyInterval)) {
			id.notified = ns
			notify = true
		}
	}
	sh.decisions[reasonIndex(d.Reason)]++
	sh.mu.Unlock()

	if notify {
		e.opts.OnThrottled(cfg.Name, r.User, d.Reason, d.DryRun)
	}
	return d
}

// staleAgain is the backoff of a watch answered locally as stale: the
// answer is the API server's own (410 Expired), but a client that comes
// back with the same stale version at once is looping, exactly like one
// whose watches die within a second. So the local answer counts as a
// failed watch of the key (see learn), and the returned wait — the time
// left of the key's backoff before this failure, 0 the first time — tells
// the caller how long to hold the answer back. A client that resyncs after
// its first "too old" is not slowed; one that loops is answered every
// Initial, 2·Initial, … (callers cap the hold). id.sh.mu is held.
func (e *Engine) staleAgain(id *identity, key watchKey, now time.Time, bo Backoff) time.Duration {
	var wait time.Duration
	if st, ok := id.backoff[key]; ok {
		wait = max(0, time.Duration(st.until-now.UnixNano()))
	}
	e.learn(id, key, now, 0, OutcomeError, bo)
	return wait
}

// checkWatch runs the checks after the stale version on a watch, in order,
// and takes its tokens when they all pass. id.sh.mu is held.
func (id *identity) checkWatch(now time.Time, r *Request, cfg *Budget) (Reason, time.Duration) {
	if id.backoff != nil {
		if st, ok := id.backoff[keyOf(r)]; ok {
			if wait := st.until - now.UnixNano(); wait > 0 {
				return ReasonBackingOff, time.Duration(wait)
			}
		}
	}
	if c := cfg.Limits.MaxConcurrentWatches; c > 0 && id.open >= c {
		return ReasonTooManyWatches, TooManyWatchesRetryAfter
	}
	if id.watch != nil {
		n := 1
		if r.initialState() {
			n = min(int(cfg.Limits.InitialStateCost), id.watch.Burst())
		}
		if !id.watch.AllowN(now, n) {
			return ReasonRateLimited, tokenWait(id.watch, now, n)
		}
	}
	return ReasonNone, 0
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
//     … then 5m;
//   - otherwise nothing changes.
func (e *Engine) WatchEnded(now time.Time, w Watch, lifetime time.Duration, outcome Outcome) {
	if w.slot == nil || !w.slot.gen.CompareAndSwap(w.gen, w.gen+1) {
		return
	}
	slots.Put(w.slot)
	id := w.id
	sh := id.sh
	sh.mu.Lock()
	id.open--
	sh.open--
	id.see(now)
	if id != sh.spill && !sh.bs.removed.Load() {
		e.learn(id, w.key, now, lifetime, outcome, sh.bs.cfg.Load().Backoff)
	}
	sh.mu.Unlock()
}

// Reasons are counted per shard at these indexes.
const (
	idxAllowed = iota
	idxRateLimited
	idxTooManyWatches
	idxBackingOff
	idxStale
	numReasons
)

var reasonsByIndex = [numReasons]Reason{reasonAllowed, ReasonRateLimited, ReasonTooManyWatches, ReasonBackingOff, ReasonStaleResourceVersion}

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
	}
	return idxAllowed
}
