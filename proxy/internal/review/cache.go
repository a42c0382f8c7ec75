package review

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// ErrThrottled means a review was needed but the review budget
// (the requester's own bucket, the shared one, MaxConcurrentReviews) is
// spent; the client gets 429.
var ErrThrottled = errors.New("too many reviews in flight")

// Cache remembers the answers of an expensive review (TokenReview,
// SubjectAccessReview) by key: bounded (LRU), with a TTL per answer, one
// review in flight per key (singleflight), and fair budgets on the reviews
// sent (Budget), so that a flood of distinct keys from one requester
// cannot become a flood of reviews nor spend another requester's reviews.
// It is safe for concurrent use.
type Cache struct {
	kind    string // "token" or "impersonation", the metrics label
	entries *utilcache.LRUExpireCache
	flights singleflight.Group
	budget  *Budget
	// slots caps the reviews in flight; LaneRecent's reviews have
	// reservedSlots of their own, so they never wait behind the others.
	slots, reservedSlots chan struct{}
	clock                clock.PassiveClock
	timeout              time.Duration
}

// NewCache returns a Cache of at most size answers of reviews of kind
// (the metrics label) that spend budget: at most concurrent reviews in
// flight, plus a quarter of that (at least one) kept for LaneRecent, each
// bounded by timeout; answers expire on clk.
func NewCache(kind string, size int, budget *Budget, concurrent int, timeout time.Duration, clk clock.PassiveClock) *Cache {
	return &Cache{
		kind:          kind,
		entries:       utilcache.NewLRUExpireCacheWithClock(size, clk),
		budget:        budget,
		slots:         make(chan struct{}, concurrent),
		reservedSlots: make(chan struct{}, max(1, concurrent/4)),
		clock:         clk,
		timeout:       timeout,
	}
}

// Lane is which of Budget's buckets a review spends.
type Lane int

const (
	// LaneNew spends the requester's own bucket, then the shared one.
	LaneNew Lane = iota
	// LaneTrusted spends the requester's own bucket only: callers known
	// to be allowed to impersonate users or groups, whom no one else can
	// starve.
	LaneTrusted
	// LaneRecent spends only the reserved bucket, and its own review
	// slots: tokens found valid a short while ago, whose callers never
	// wait behind (or are throttled by) floods of unknown tokens. Without
	// a reserved bucket it is LaneNew.
	LaneRecent
)

// Get returns the cached answer for key, or runs review once for every
// caller asking for key at the same time and caches its answer for the TTL
// it returns (0: not cached). A review is sent only when requester's
// budget in lane allows (see Budget.allow). Errors are never cached.
// A review lasts at most the cache's timeout; it is shared by every
// request waiting for the same key, so it does not follow any one
// request's context.
func (c *Cache) Get(ctx context.Context, key, requester string, lane Lane, review func(context.Context) (any, time.Duration, error)) (any, error) {
	return c.get(ctx, key, requester, false, lane, review)
}

// GetAsContextRequester is Get for the requester that ctx names
// (RequesterFrom), worked out only when a review is to be sent: a
// request whose answer is cached does not pay for it (WithRequesterOf).
func (c *Cache) GetAsContextRequester(ctx context.Context, key string, lane Lane, review func(context.Context) (any, time.Duration, error)) (any, error) {
	return c.get(ctx, key, "", true, lane, review)
}

// get is Get; with fromContext, the requester is RequesterFrom(ctx).
func (c *Cache) get(ctx context.Context, key, requester string, fromContext bool, lane Lane, review func(context.Context) (any, time.Duration, error)) (any, error) {
	if v, ok := c.entries.Get(key); ok {
		reviewCacheLookups.WithLabelValues(c.kind, "hit").Inc()
		return v, nil
	}
	reviewCacheLookups.WithLabelValues(c.kind, "miss").Inc()
	ch := c.flights.DoChan(key, func() (any, error) {
		if v, ok := c.entries.Get(key); ok {
			return v, nil
		}
		if fromContext {
			requester = RequesterFrom(ctx)
		}
		if !c.budget.Allow(requester, lane, c.clock.Now()) {
			reviewsThrottled.WithLabelValues(c.kind).Inc()
			return nil, ErrThrottled
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
		defer cancel()
		slots := c.slots
		if lane == LaneRecent && c.budget.reserved != nil {
			slots = c.reservedSlots
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		case <-rctx.Done():
			reviewsThrottled.WithLabelValues(c.kind).Inc()
			return nil, ErrThrottled
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

// Budget is the review budget: a token bucket per requester (a
// client's network prefix for TokenReviews, a caller for
// SubjectAccessReviews), one shared bucket, and optionally a reserved one.
// A review needs a token from the requester's bucket first, so a requester
// that floods empties only its own bucket and never the shared one beyond
// its own rate; trusted requesters (LaneTrusted: callers already known to
// be allowed to impersonate users or groups) skip the shared bucket, so no one else can
// starve them; reviews of LaneRecent take only from the reserved bucket,
// which nothing else spends. At most maxRequesters buckets are kept (LRU);
// a requester pushed out starts again with a full bucket. The state per
// requester is its key (bounded by the caller: a network prefix or a hash)
// and one rate.Limiter. It is safe for concurrent use.
//
// The per-requester buckets evict rather than send requesters beyond the
// cap to one shared overflow bucket (as ratelimit.KeyRate does) because a
// newcomer must always get a bucket of its own: a flood of requesters
// (IPv6 /64s are cheap) sharing an overflow bucket with every later
// requester would starve them all of reviews, the trusted lane too, which
// skips the shared bucket so that no stranger can starve it. What the
// fresh buckets a flood gets hand out is bounded by the shared bucket,
// which LaneNew always spends too; KeyRate has nothing behind its
// per-key bucket, so there a newcomer may not evict.
type Budget struct {
	shared       *rate.Limiter
	reserved     *rate.Limiter // nil: none
	perSecond    rate.Limit
	burst        int
	mu           sync.Mutex
	perRequester *lru.Cache
}

// NewBudget returns a Budget whose shared bucket refills at
// sharedPerSecond up to sharedBurst, and each requester's at perSecond up
// to burst, for at most maxRequesters requesters; it has no reserved
// bucket until WithReserve.
func NewBudget(sharedPerSecond float64, sharedBurst int, perSecond float64, burst, maxRequesters int) *Budget {
	return &Budget{
		shared:       rate.NewLimiter(rate.Limit(sharedPerSecond), sharedBurst),
		perSecond:    rate.Limit(perSecond),
		burst:        burst,
		perRequester: lru.New(maxRequesters),
	}
}

// WithReserve gives f a reserved bucket for LaneRecent, and returns f.
func (f *Budget) WithReserve(perSecond float64, burst int) *Budget {
	f.reserved = rate.NewLimiter(rate.Limit(perSecond), max(1, burst))
	return f
}

// Allow takes, at now, a token from the reserved bucket for LaneRecent;
// otherwise one from requester's bucket and, for LaneNew, one from the
// shared bucket.
func (f *Budget) Allow(requester string, lane Lane, now time.Time) bool {
	if lane == LaneRecent && f.reserved != nil {
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
	return lane == LaneTrusted || f.shared.AllowN(now, 1)
}

// requesterKey is the context key of the review requester.
type requesterKey struct{}

// WithRequester names whose review budget (Budget) the reviews
// made for this request spend.
func WithRequester(ctx context.Context, requester string) context.Context {
	return context.WithValue(ctx, requesterKey{}, requester)
}

// WithRequesterOf is WithRequester for a requester that is worked out
// (requester()) only when a review asks for it: most requests are
// answered from a cache and spend no budget.
func WithRequesterOf(ctx context.Context, requester func() string) context.Context {
	return context.WithValue(ctx, requesterKey{}, requester)
}

// RequesterFrom returns the requester WithRequester or WithRequesterOf
// named, "" when none.
func RequesterFrom(ctx context.Context) string {
	switch r := ctx.Value(requesterKey{}).(type) {
	case string:
		return r
	case func() string:
		return r()
	}
	return ""
}

// Metrics of the reviews. No label holds a user name, a token or a client
// address: every label is an enum.
var (
	reviewsSent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_reviews_sent_total",
		Help: "TokenReviews (review=token), impersonation SubjectAccessReviews (review=impersonation) and the top endpoint's access SubjectAccessReviews (review=access) sent to the API server.",
	}, []string{"review"})

	reviewsFailed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_reviews_failed_total",
		Help: "Reviews sent that failed or timed out, by review (token, impersonation, access).",
	}, []string{"review"})

	reviewFailOpen = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_review_fail_open_total",
		Help: "Requests forwarded although their review failed (--review-failure-policy=Open), by review (token, impersonation).",
	}, []string{"review"})

	reviewCacheLookups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_review_cache_lookups_total",
		Help: "Lookups in the TokenReview (review=token), impersonation SubjectAccessReview (review=impersonation) and top endpoint access SubjectAccessReview (review=access) caches, by result (hit, miss).",
	}, []string{"review", "result"})

	reviewsThrottled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_reviews_throttled_total",
		Help: "Reviews not sent because the review rate or concurrency limit was reached, by review (token, impersonation, access).",
	}, []string{"review"})
)

func init() {
	metrics.Registry.MustRegister(reviewsSent, reviewsFailed, reviewFailOpen, reviewCacheLookups, reviewsThrottled)
}
