package ratelimit

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// numShards splits each budget's identities over this many locks, so
// requests by different identities rarely wait for each other.
const numShards = 64

// budgetState is everything an Engine tracks for one budget, by name. It
// outlives Policy swaps that keep the name.
type budgetState struct {
	name string
	// cfg is the budget as compiled in the current policy.
	cfg atomic.Pointer[Budget]
	// removed is set when a policy swap drops the budget; its shards are
	// then emptied and take no new state.
	removed atomic.Bool

	shards [numShards]shard
	// overflow governs identities that arrive while the engine tracks
	// Options.MaxTrackedKeys identities: they share its single identity.
	overflow shard
	// aggregates hold the budget's Aggregate per impersonating caller,
	// with aggregateOverflow as overflow; their identities use only the
	// watch bucket and the count of open watches.
	aggregates        [numShards]shard
	aggregateOverflow shard

	// retiredMu guards retired: the observed peaks of the identities Sweep
	// evicted, since the budget appeared (retired.Since).
	retiredMu sync.Mutex
	retired   ObservedPeaks
}

// shard is a lock and the identities it guards.
type shard struct {
	mu sync.Mutex
	bs *budgetState
	// ids holds the identities by the hash of their user name (the hash
	// that chose the shard, so a decision hashes the name once), each
	// chained through identity.next with the rare others of the same hash.
	ids map[uint64]*identity // guarded by mu
	// tracked is the number of identities in ids.
	tracked int // guarded by mu
	// spill is the overflow shard's single, shared identity.
	spill *identity // guarded by mu
	// open counts admitted, unreleased watches.
	open int64 // guarded by mu
	// decisions counts by reasonIndex.
	decisions [numReasons]int64 // guarded by mu
	// exempt counts decisions of an Exempt budget, which take no lock.
	exempt atomic.Int64
	_      [64]byte // keep shards on separate cache lines
}

// identity is one user's state under one budget. Its fields are guarded by
// sh.mu.
type identity struct {
	user string
	sh   *shard
	// hash is user's hash under Engine.userSeed; next is the next identity
	// of the shard with the same hash.
	hash uint64
	next *identity
	// cfg is the budget the buckets were last configured from, and
	// shareGen the generation of the Shares (Engine.SetShares).
	cfg      *Budget
	shareGen uint32
	// maxOpen is cfg's MaxConcurrentWatches scaled by the identity's
	// share; 0 means no cap.
	maxOpen int32
	// asked counts the watches it asked for, and capped those refused
	// for its cap, since the last Engine.Demand (saturating).
	asked, capped uint32
	// watch and list are the zero bucket when opens / lists are not
	// limited.
	watch, list bucket
	// resLists are its rebuild buckets per resource (resourcelists.go);
	// nil until it rebuilds under ListsPerMinutePerResource.
	resLists *resourceLists
	// backoff is per watch key, with at most
	// Options.MaxBackoffKeysPerIdentity keys plus overflowKey; nil until a
	// watch fails or is answered stale.
	backoff map[watchKey]backoffState
	// lastActive is the latest instant (UnixNano) the identity was decided
	// on or released a watch, for eviction.
	lastActive int64
	// bucketsAt is the latest instant (UnixNano) its buckets were used or
	// reconfigured at: they never run backwards from it.
	bucketsAt  int64
	notified   int64 // last OnThrottled call, UnixNano
	rejections int64
	open       int32
	// opens counts the watches admitted since the identity was tracked
	// (DryRun's too), saturating; for Top. It fills open's padding.
	opens uint32
	// obs is what the identity did, for its budget's observed peaks.
	obs observation
	// watches lists its open watches' slots (see slot).
	watches *slot
}

// link adds s to the identity's open watches and makes it s's owner.
// id.sh.mu is held.
func (id *identity) link(s *slot) {
	s.prev, s.next = nil, id.watches
	if id.watches != nil {
		id.watches.prev = s
	}
	id.watches = s
	s.owner.Store(id)
}

// unlink removes s from the identity's open watches. id.sh.mu is held.
func (id *identity) unlink(s *slot) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		id.watches = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	}
	s.prev, s.next = nil, nil
}

// lockOwner locks the shard of s's owner and returns the owner, which
// cannot change until the lock is released.
func lockOwner(s *slot) *identity {
	for {
		id := s.owner.Load()
		id.sh.mu.Lock()
		if s.owner.Load() == id {
			return id
		}
		id.sh.mu.Unlock()
	}
}

// newBudgetState is the state of budget b, which appears at now.
func newBudgetState(b *Budget, now time.Time) *budgetState {
	bs := &budgetState{name: b.Name}
	bs.retired.Since = now
	bs.cfg.Store(b)
	for i := range bs.shards {
		bs.shards[i].bs = bs
		bs.shards[i].ids = make(map[uint64]*identity)
	}
	bs.overflow.bs = bs
	bs.overflow.spill = &identity{user: "", sh: &bs.overflow}
	for i := range bs.aggregates {
		bs.aggregates[i].bs = bs
		bs.aggregates[i].ids = make(map[uint64]*identity)
	}
	bs.aggregateOverflow.bs = bs
	bs.aggregateOverflow.spill = &identity{user: "", sh: &bs.aggregateOverflow}
	return bs
}

// maxUserBytes bounds the user name an identity keeps. Names are the
// API server's (a token's user, or an impersonated one the caller may
// impersonate), and rarely longer than a few dozen bytes; a longer one is
// kept as its first bytes and a 128-bit hash under the engine's secret
// seeds (see userKey), so an identity's size does not depend on it.
const maxUserBytes = 512

// userKey is the name an identity of user is kept and found under: user
// itself, or, beyond maxUserBytes, its first bytes, "…" and 32 hex digits
// of its hash (507 bytes). A short name cannot pose as a long one's key
// without knowing the seeds.
func (e *Engine) userKey(user string) string {
	if len(user) <= maxUserBytes {
		return user
	}
	h := e.seeds.watchKeyOf(&requestKey{group: user})
	return fmt.Sprintf("%s…%016x%016x", user[:maxUserBytes-40], h.hi, h.lo)
}

// shardFor returns the shard of the user whose name hashes to h.
func (bs *budgetState) shardFor(h uint64) *shard { return &bs.shards[h%numShards] }

// find returns the identity of user, whose name hashes to h, or nil.
// sh.mu is held.
func (sh *shard) find(h uint64, user string) *identity {
	for id := sh.ids[h]; id != nil; id = id.next {
		if id.user == user {
			return id
		}
	}
	return nil
}

// each calls f for every identity of the shard. sh.mu is held.
func (sh *shard) each(f func(*identity)) {
	for _, id := range sh.ids {
		for ; id != nil; id = id.next {
			f(id)
		}
	}
}

// evict drops the identities for which drop is true, and returns how
// many. sh.mu is held.
func (sh *shard) evict(drop func(*identity) bool) (n int) {
	for h, head := range sh.ids {
		var kept *identity
		for id := head; id != nil; {
			next := id.next
			if drop(id) {
				n++
			} else {
				id.next, kept = kept, id
			}
			id = next
		}
		if kept == nil {
			delete(sh.ids, h)
		} else {
			sh.ids[h] = kept
		}
	}
	sh.tracked -= n
	return n
}

// track starts tracking user (a userKey), whose name hashes to h, in sh, or returns
// nil when the engine already tracks its maximum of identities or the
// budget was removed (the caller then uses the overflow identity). sh.mu
// is held.
func (e *Engine) track(sh *shard, h uint64, user string) *identity {
	if sh.bs.removed.Load() || !e.identities.take() {
		return nil
	}
	id := &identity{user: strings.Clone(user), sh: sh, hash: h, next: sh.ids[h]}
	sh.ids[h] = id
	sh.tracked++
	return id
}

// lockedIdentity returns the identity of user (a userKey), whose name
// hashes to h, in sh, tracking it if need be, with its shard's lock held:
// sh's, or overflow's, whose shared identity it is when the engine tracks
// its maximum of identities.
func (e *Engine) lockedIdentity(sh, overflow *shard, h uint64, user string) *identity {
	sh.mu.Lock()
	if id := sh.find(h, user); id != nil {
		return id
	}
	if id := e.track(sh, h, user); id != nil {
		return id
	}
	sh.mu.Unlock()
	overflow.mu.Lock()
	return overflow.spill
}

// advance moves the identity's clock to now (UnixNano; or keeps it, when
// now is earlier: concurrent callers' instants may arrive out of order, and
// a bucket whose clock ran backwards would hand out tokens twice), and
// reconfigures its buckets when the budget changed. It returns the instant
// (UnixNano) to decide at. id.sh.mu is held.
func (e *Engine) advance(id *identity, now int64, cfg *Budget) int64 {
	now = id.clock(now)
	id.touch(now)
	if id.cfg != cfg || id.shareGen != e.shares.Load().gen {
		e.configure(id, now, cfg)
	}
	return now
}

// clock returns now (UnixNano), or the buckets' latest instant when now is
// earlier, and makes it the buckets' latest instant.
func (id *identity) clock(now int64) int64 {
	if now < id.bucketsAt {
		return id.bucketsAt
	}
	id.bucketsAt = now
	return now
}

// touch records activity at now (UnixNano), for eviction.
func (id *identity) touch(now int64) {
	id.lastActive = max(id.lastActive, now)
}

// configure makes the buckets and the cap follow cfg, scaled by the
// identity's share of it (see Shares), at now (UnixNano), keeping the tokens they
// hold (setLimitAt and setBurstAt advance first, as rate.Limiter's
// SetLimitAt and SetBurstAt do). A bucket that appears starts full, like a
// new identity's. A budget without backoff
// clears the identity's backoff delays (keeping its stale-answer records,
// which hold repeats back whatever the backoff). id.sh.mu is held.
func (e *Engine) configure(id *identity, now int64, cfg *Budget) {
	id.cfg = cfg
	sh := e.shares.Load()
	id.shareGen = sh.gen
	f := sh.shares.of(cfg.Name, id.user)
	l := &cfg.Limits
	id.maxOpen = scaleCount(l.MaxConcurrentWatches, f)
	rebucket(&id.watch, now, float64(l.WatchOpensPerMinute)*min(f, 1), scaleCount(l.WatchBurst, f))
	rebucket(&id.list, now, float64(l.ListsPerMinute)*min(f, 1), scaleCount(l.ListBurst, f))
	if l.ListsPerMinutePerResource == 0 {
		id.resLists = nil
	}
	if cfg.Backoff.Initial == 0 {
		for k, st := range id.backoff {
			if st.staleAt == 0 {
				e.forget(id, k)
			} else {
				id.backoff[k] = backoffState{staleAt: st.staleAt}
			}
		}
	}
}

// rebucket makes b refill at perMinute up to burst from now, keeping its
// tokens; perMinute ≤ 0 makes it the zero (unlimited) bucket.
func rebucket(b *bucket, now int64, perMinute float64, burst int32) {
	if perMinute <= 0 {
		*b = bucket{}
		return
	}
	r := perMinute / 60
	if !b.limited() {
		*b = newBucket(now, r, int(burst))
		return
	}
	if b.limit != r {
		b.setLimitAt(now, r)
	}
	if b.burst != int(burst) {
		b.setBurstAt(now, int(burst))
	}
}

// idle reports whether dropping the identity would change no decision: it
// holds no watch, no backoff, full buckets, and was last active at least
// idleAfter before now.
func (id *identity) idle(now time.Time, idleAfter time.Duration) bool {
	return id.open == 0 && len(id.backoff) == 0 &&
		now.UnixNano()-id.lastActive >= int64(idleAfter) &&
		full(&id.watch, now) && full(&id.list, now) && id.resLists.full(now)
}

func full(b *bucket, now time.Time) bool {
	return !b.limited() || b.tokensAt(now.UnixNano()) >= float64(b.burst)
}

// tokenWait is how long from now (UnixNano) until b holds n tokens.
func tokenWait(b *bucket, now int64, n int) time.Duration {
	missing := float64(n) - b.tokensAt(now)
	d := time.Duration(missing / b.limit * float64(time.Second))
	if float64(d) < missing/b.limit*float64(time.Second) {
		d++ // round up: never tell a client to come back too early
	}
	return max(d, 1)
}
