package ratelimit

import (
	"hash/maphash"
	"math"
	"sync"
	"time"
)

// KeyRate is one token bucket per key (rate.Limiter's arithmetic, see
// bucket) with the same limit and burst for every key: a ceiling on how
// often each of many callers may do one thing, such as open a watch.
// Every method takes the current time, so tests are timelines at fixed
// instants. It is safe for concurrent use.
//
// State is bounded in count and bytes whatever keys callers send: a key is
// stored as a 128-bit hash of two secret seeds (16 bytes, whatever its
// length) beside its 32-byte bucket, at most maxKeys of them; the keys
// beyond that share one overflow bucket (limited together, never
// unlimited). A bucket that has refilled to its burst is indistinguishable
// from a new key's, so it is dropped, at the latest when a decision comes
// a refill time (burst ÷ limit) after the last sweep: dropping it changes
// no decision.
//
// Keys beyond the cap share the overflow bucket rather than evicting
// another key (as proxy/internal/review.Budget's per-requester buckets
// do) because the per-key bucket is the whole limit here: nothing stands
// behind it. Were a newcomer to evict the least recently used key and
// start full, a caller with more keys than the cap (a namespace's minted
// service accounts) could cycle through them and take a full burst per
// key, and reset the buckets it evicted; with the overflow bucket the
// most it gets is maxKeys bursts plus one. Budget's requesters have a
// shared bucket behind their own, which bounds what fresh buckets hand
// out, and a lane (trusted impersonators) that must never share a bucket
// with strangers, so there a newcomer evicts.
type KeyRate struct {
	limit   float64
	burst   int
	maxKeys int
	seeds   [2]maphash.Seed
	// refill is the time (ns) an empty bucket takes to refill, the sweep
	// interval.
	refill int64

	mu        sync.Mutex
	buckets   map[rateKey]bucket // guarded by mu
	overflow  bucket             // guarded by mu
	lastSweep int64              // guarded by mu
}

// rateKey is a key's fixed-size stand-in: two maphash sums under secret
// seeds, so that callers cannot aim for a collision (about n²/2¹²⁹ for n
// keys).
type rateKey struct{ hi, lo uint64 }

// NewKeyRate returns a KeyRate of limit tokens a second up to burst per
// key, tracking at most maxKeys keys; limit and burst must be positive.
func NewKeyRate(limit float64, burst, maxKeys int) *KeyRate {
	return &KeyRate{
		limit: limit, burst: burst, maxKeys: max(maxKeys, 1),
		seeds:   [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		refill:  int64(math.Ceil(float64(burst) / limit * float64(time.Second))),
		buckets: map[rateKey]bucket{},
	}
}

// Allow takes one token of key's bucket at now and reports true, or, when
// the bucket is empty, takes nothing and returns the wait until it holds a
// token again.
func (k *KeyRate) Allow(now time.Time, key string) (wait time.Duration, ok bool) {
	ns := now.UnixNano()
	rk := rateKey{hi: maphash.String(k.seeds[0], key), lo: maphash.String(k.seeds[1], key)}
	k.mu.Lock()
	defer k.mu.Unlock()
	if ns-k.lastSweep >= k.refill {
		k.sweep(ns)
	}
	b, tracked := k.buckets[rk]
	switch {
	case tracked:
	case len(k.buckets) < k.maxKeys:
		b = newBucket(ns, k.limit, k.burst)
	default:
		return k.take(&k.overflow, ns)
	}
	wait, ok = k.take(&b, ns)
	k.buckets[rk] = b
	return wait, ok
}

// take takes a token of b at now, or returns how long until it holds one.
func (k *KeyRate) take(b *bucket, now int64) (time.Duration, bool) {
	if !b.limited() {
		*b = newBucket(now, k.limit, k.burst)
	}
	if b.allowN(now, 1) {
		return 0, true
	}
	return max(durationFromTokens(1-b.tokensAt(now), k.limit), 1), false
}

// sweep drops the buckets that are full again at now.
func (k *KeyRate) sweep(now int64) {
	k.lastSweep = now
	for rk, b := range k.buckets {
		if b.tokensAt(now) >= float64(b.burst) {
			delete(k.buckets, rk)
		}
	}
}

// Len is the number of keys tracked (not counting the overflow bucket).
func (k *KeyRate) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.buckets)
}
