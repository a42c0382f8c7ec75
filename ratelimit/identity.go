package ratelimit

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// numShards splits each budget's identities over this many locks, so
// requests by different identities rarely wait for each other.
const numShards = 64

// budgetState is everything an Engine tracks for one budget, by name. It
// outlives Policy swaps that keep the name.
type budgetState struct {
	name string
	// keys is the engine's count of tracked keys.
	keys *atomic.Int64
	// cfg is the budget as compiled in the current policy.
	cfg atomic.Pointer[Budget]
	// removed is set when a policy swap drops the budget; its shards are
	// then emptied and take no new state.
	removed atomic.Bool

	shards [numShards]shard
	// overflow governs identities that arrive while the engine tracks
	// Options.MaxTrackedKeys keys: they share its single identity.
	overflow shard
}

// shard is a lock and the identities it guards.
type shard struct {
	mu  sync.Mutex
	bs  *budgetState
	ids map[string]*identity // guarded by mu
	// spill is the overflow shard's single, shared identity.
	spill *identity // guarded by mu
	// keys counts identities and backoff keys, for the engine-wide cap.
	keys int64 // guarded by mu
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
	// cfg is the budget the buckets were last configured from.
	cfg *Budget
	// watch and list are nil when opens / lists are not limited.
	watch, list *rate.Limiter
	// backoff is per watch key; nil until a watch fails.
	backoff map[watchKey]backoffState
	// seen is the latest instant (UnixNano) the identity was decided on or
	// released a watch, for eviction.
	seen int64
	// tick is the latest instant (UnixNano) its buckets were used or
	// reconfigured at: they never run backwards from it.
	tick       int64
	notified   int64 // last OnThrottled call, UnixNano
	rejections int64
	open       int32
}

// watchKey is what backoff is kept per, besides the identity.
type watchKey struct {
	group, resource, namespace, labelSelector, fieldSelector string
}

func keyOf(r *Request) watchKey {
	return watchKey{r.Group, r.Resource, r.Namespace, r.LabelSelector, r.FieldSelector}
}

func (k watchKey) clone() watchKey {
	return watchKey{strings.Clone(k.group), strings.Clone(k.resource), strings.Clone(k.namespace),
		strings.Clone(k.labelSelector), strings.Clone(k.fieldSelector)}
}

func newBudgetState(b *Budget, keys *atomic.Int64) *budgetState {
	bs := &budgetState{name: b.Name, keys: keys}
	bs.cfg.Store(b)
	for i := range bs.shards {
		bs.shards[i].bs = bs
		bs.shards[i].ids = make(map[string]*identity)
	}
	bs.overflow.bs = bs
	bs.overflow.spill = &identity{user: "", sh: &bs.overflow}
	return bs
}

func (bs *budgetState) shardFor(seed maphash.Seed, user string) *shard {
	return &bs.shards[maphash.String(seed, user)%numShards]
}

// acquire returns user's identity in sh, creating it if needed, with its
// shard locked; the caller unlocks id.sh.mu. When the engine already tracks
// its maximum of keys, or the budget was removed, the identity is the
// budget's shared overflow identity. The returned identity's buckets follow
// cfg and its clock is at least now; acquire returns the instant to decide
// at.
func (e *Engine) acquire(sh *shard, user string, cfg *Budget, now time.Time) (*identity, time.Time) {
	sh.mu.Lock()
	id := sh.ids[user]
	if id == nil {
		if !sh.bs.removed.Load() && e.keys.Add(1) <= int64(e.opts.MaxTrackedKeys) {
			id = &identity{user: strings.Clone(user), sh: sh}
			sh.ids[id.user] = id
			sh.keys++
		} else {
			if !sh.bs.removed.Load() {
				e.keys.Add(-1)
			}
			sh.mu.Unlock()
			sh = &sh.bs.overflow
			sh.mu.Lock()
			id = sh.spill
		}
	}
	return id, id.advance(now, cfg)
}

// advance moves the identity's clock to now (or keeps it, when now is
// earlier: concurrent callers' instants may arrive out of order, and a
// bucket whose clock ran backwards would hand out tokens twice), and
// reconfigures its buckets when the budget changed. It returns the instant
// to decide at.
func (id *identity) advance(now time.Time, cfg *Budget) time.Time {
	now = id.clock(now)
	id.see(now)
	if id.cfg != cfg {
		id.configure(now, cfg)
	}
	return now
}

// clock returns now, or the buckets' latest instant when now is earlier,
// and makes it the buckets' latest instant.
func (id *identity) clock(now time.Time) time.Time {
	ns := now.UnixNano()
	if ns < id.tick {
		return time.Unix(0, id.tick)
	}
	id.tick = ns
	return now
}

// see records activity at now, for eviction.
func (id *identity) see(now time.Time) {
	id.seen = max(id.seen, now.UnixNano())
}

// configure makes the buckets follow cfg at now, keeping the tokens they
// hold (rate.Limiter's SetLimitAt and SetBurstAt advance first). A bucket
// that appears starts full, like a new identity's.
func (id *identity) configure(now time.Time, cfg *Budget) {
	id.cfg = cfg
	id.watch = rebucket(id.watch, now, cfg.Limits.WatchOpensPerMinute, cfg.Limits.WatchBurst)
	id.list = rebucket(id.list, now, cfg.Limits.ListsPerMinute, cfg.Limits.ListBurst)
	if cfg.Backoff.Initial == 0 && id.backoff != nil {
		id.sh.keys -= int64(len(id.backoff))
		id.sh.bs.keys.Add(-int64(len(id.backoff)))
		id.backoff = nil
	}
}

func rebucket(lim *rate.Limiter, now time.Time, perMinute, burst int32) *rate.Limiter {
	if perMinute <= 0 {
		return nil
	}
	r := rate.Limit(float64(perMinute) / 60)
	if lim == nil {
		return rate.NewLimiter(r, int(burst))
	}
	if lim.Limit() != r {
		lim.SetLimitAt(now, r)
	}
	if lim.Burst() != int(burst) {
		lim.SetBurstAt(now, int(burst))
	}
	return lim
}

// idle reports whether dropping the identity would change no decision: it
// holds no watch, no backoff, full buckets, and was last seen at least
// idleAfter before now.
func (id *identity) idle(now time.Time, idleAfter time.Duration) bool {
	return id.open == 0 && len(id.backoff) == 0 &&
		now.UnixNano()-id.seen >= int64(idleAfter) &&
		full(id.watch, now) && full(id.list, now)
}

func full(lim *rate.Limiter, now time.Time) bool {
	return lim == nil || lim.TokensAt(now) >= float64(lim.Burst())
}

// tokenWait is how long until lim holds n tokens.
func tokenWait(lim *rate.Limiter, now time.Time, n int) time.Duration {
	missing := float64(n) - lim.TokensAt(now)
	d := time.Duration(missing / float64(lim.Limit()) * float64(time.Second))
	if float64(d) < missing/float64(lim.Limit())*float64(time.Second) {
		d++ // round up: never tell a client to come back too early
	}
	return max(d, 1)
}
