package proxy

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
)

// errReviewsThrottled means a review was needed but the review budget
// (ReviewsPerSecond, MaxConcurrentReviews) is spent; the client gets 429.
var errReviewsThrottled = errors.New("too many reviews in flight")

// reviewTimeout bounds one review; the lookup is shared by every request
// waiting for the same key, so it does not follow any one request's context.
const reviewTimeout = 10 * time.Second

// reviewCache remembers the answers of an expensive review (TokenReview,
// SubjectAccessReview) by key: bounded (LRU), with a TTL per answer, one
// review in flight per key (singleflight), and a token bucket plus a
// concurrency cap on the reviews sent, so that a flood of distinct keys
// cannot become a flood of reviews. It is safe for concurrent use.
type reviewCache struct {
	kind    string // "token" or "impersonation", the metrics label
	entries *utilcache.LRUExpireCache
	flights singleflight.Group
	limiter *rate.Limiter
	slots   chan struct{}
	clock   clock.PassiveClock
}

func newReviewCache(kind string, size int, perSecond float64, burst, concurrent int, clk clock.PassiveClock) *reviewCache {
	return &reviewCache{
		kind:    kind,
		entries: utilcache.NewLRUExpireCacheWithClock(size, clk),
		limiter: rate.NewLimiter(rate.Limit(perSecond), burst),
		slots:   make(chan struct{}, concurrent),
		clock:   clk,
	}
}

// get returns the cached answer for key, or runs review once for every
// caller asking for key at the same time and caches its answer for the TTL
// it returns (0: not cached). Errors are never cached.
func (c *reviewCache) get(ctx context.Context, key string, review func(context.Context) (any, time.Duration, error)) (any, error) {
	if v, ok := c.entries.Get(key); ok {
		reviewCacheLookups.WithLabelValues(c.kind, "hit").Inc()
		return v, nil
	}
	reviewCacheLookups.WithLabelValues(c.kind, "miss").Inc()
	ch := c.flights.DoChan(key, func() (any, error) {
		if v, ok := c.entries.Get(key); ok {
			return v, nil
		}
		if !c.limiter.AllowN(c.clock.Now(), 1) {
			reviewsThrottled.WithLabelValues(c.kind).Inc()
			return nil, errReviewsThrottled
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		select {
		case c.slots <- struct{}{}:
			defer func() { <-c.slots }()
		case <-rctx.Done():
			reviewsThrottled.WithLabelValues(c.kind).Inc()
			return nil, errReviewsThrottled
		}
		v, ttl, err := review(rctx)
		if err != nil {
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
