package proxy

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// errReviewsThrottled means a review was needed but the review budget
// (the requester's own bucket, the shared one, MaxConcurrentReviews) is
// spent; the client gets 429.
var errReviewsThrottled = errors.New("too many reviews in flight")

// reviewCache remembers the answers of an expensive review (TokenReview,
// SubjectAccessReview) by key: bounded (LRU), with a TTL per answer, one
// review in flight per key (singleflight), and fair budgets on the reviews
// sent (fairReviews), so that a flood of distinct keys from one requester
// cannot become a flood of reviews nor spend another requester's reviews.
// It is safe for concurrent use.
type reviewCache struct {
	kind    string // "token" or "impersonation", the metrics label
	entries *utilcache.LRUExpireCache
	flights singleflight.Group
	budget  *fairReviews
	// slots caps the reviews in flight; laneRecent's reviews have
	// reservedSlots of their own, so they never wait behind the others.
	slots, reservedSlots chan struct{}
	clock                clock.PassiveClock
	timeout              time.Duration
}

func newReviewCache(kind string, size int, budget *fairReviews, concurrent int, timeout time.Duration, clk clock.PassiveClock) *reviewCache {
	return &reviewCache{
		kind:          kind,
		entries:       utilcache.NewLRUExpireCacheWithClock(size, clk),
		budget:        budget,
		slots:         make(chan struct{}, concurrent),
		reservedSlots: make(chan struct{}, max(1, concurrent/4)),
		clock:         clk,
		timeout:       timeout,
	}
}

// reviewLane is which of fairReviews' buckets a review spends.
type reviewLane int

const (
	// laneNew spends the requester's own bucket, then the shared one.
	laneNew reviewLane = iota
	// laneTrusted spends the requester's own bucket only: callers known
	// to be allowed to impersonate users or groups, whom no one else can
	// starve.
	laneTrusted
	// laneRecent spends only the reserved bucket, and its own review
	// slots: tokens found valid a short while ago, whose callers never
	// wait behind (or are throttled by) floods of unknown tokens. Without
	// a reserved bucket it is laneNew.
	laneRecent
)

// get returns the cached answer for key, or runs review once for every
// caller asking for key at the same time and caches its answer for the TTL
// it returns (0: not cached). A review is sent only when requester's
// budget in lane allows (see fairReviews.allow). Errors are never cached.
// A review lasts at most the cache's timeout; it is shared by every
// request waiting for the same key, so it does not follow any one
// request's context.
func (c *reviewCache) get(ctx context.Context, key, requester string, lane reviewLane, review func(context.Context) (any, time.Duration, error)) (any, error) {
	if v, ok := c.entries.Get(key); ok {
		reviewCacheLookups.WithLabelValues(c.kind, "hit").Inc()
		return v, nil
	}
	reviewCacheLookups.WithLabelValues(c.kind, "miss").Inc()
	ch := c.flights.DoChan(key, func() (any, error) {
		if v, ok := c.entries.Get(key); ok {
			return v, nil
		}
		if !c.budget.allow(requester, lane, c.clock.Now()) {
			reviewsThrottled.WithLabelValues(c.kind).Inc()
			return nil, errReviewsThrottled
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
		defer cancel()
		slots := c.slots
		if lane == laneRecent && c.budget.reserved != nil {
			slots = c.reservedSlots
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		case <-rctx.Done():
			reviewsThrottled.WithLabelValues(c.kind).Inc()
			return nil, errReviewsThrottled
		}
		reviewsSent.WithLabelValues(c.kind).Inc()
		v, ttl, err := review(rctx)
		if err != nil {
			reviewsFailed.WithLabelValues(c.kind).Inc()
			return nil, err
		}
		if ttl > 0 {
			c.entries.Add(key, v, ttl)
		}
		return v, nil
	})
	select {
	case res := <-ch:
		return res.Val, res.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fairReviews is the review budget: a token bucket per requester (a
// client's network prefix for TokenReviews, a caller for
// SubjectAccessReviews), one shared bucket, and optionally a reserved one.
// A review needs a token from the requester's bucket first, so a requester
// that floods empties only its own bucket and never the shared one beyond
// its own rate; trusted requesters (laneTrusted: callers already known to
// be allowed to impersonate users or groups) skip the shared bucket, so no one else can
// starve them; reviews of laneRecent take only from the reserved bucket,
// which nothing else spends. At most maxRequesters buckets are kept (LRU);
// a requester pushed out starts again with a full bucket. The state per
// requester is its key (bounded by the caller: a network prefix or a hash)
// and one rate.Limiter. It is safe for concurrent use.
type fairReviews struct {
	shared       *rate.Limiter
	reserved     *rate.Limiter // nil: none
	perSecond    rate.Limit
	burst        int
	mu           sync.Mutex
	perRequester *lru.Cache
}

func newFairReviews(sharedPerSecond float64, sharedBurst int, perSecond float64, burst, maxRequesters int) *fairReviews {
	return &fairReviews{
		shared:       rate.NewLimiter(rate.Limit(sharedPerSecond), sharedBurst),
		perSecond:    rate.Limit(perSecond),
		burst:        burst,
		perRequester: lru.New(maxRequesters),
	}
}

// withReserve gives f a reserved bucket for laneRecent, and returns f.
func (f *fairReviews) withReserve(perSecond float64, burst int) *fairReviews {
	f.reserved = rate.NewLimiter(rate.Limit(perSecond), max(1, burst))
	return f
}

// allow takes, at now, a token from the reserved bucket for laneRecent;
// otherwise one from requester's bucket and, for laneNew, one from the
// shared bucket.
func (f *fairReviews) allow(requester string, lane reviewLane, now time.Time) bool {
	if lane == laneRecent && f.reserved != nil {
		return f.reserved.AllowN(now, 1)
	}
	f.mu.Lock()
	var l *rate.Limiter
	if v, ok := f.perRequester.Get(requester); ok {
		l = v.(*rate.Limiter)
	} else {
		l = rate.NewLimiter(f.perSecond, f.burst)
		f.perRequester.Add(requester, l)
	}
	f.mu.Unlock()
	if !l.AllowN(now, 1) {
		return false
	}
	return lane == laneTrusted || f.shared.AllowN(now, 1)
}

// requesterKey is the context key of the review requester.
type requesterKey struct{}

// withReviewRequester names whose review budget (fairReviews) the reviews
// made for this request spend.
func withReviewRequester(ctx context.Context, requester string) context.Context {
	return context.WithValue(ctx, requesterKey{}, requester)
}

func reviewRequesterFrom(ctx context.Context) string {
	s, _ := ctx.Value(requesterKey{}).(string)
	return s
}
