package admit

import (
	"fmt"
	"math"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/ratelimit"
)

const (
	// DefaultWatchOpensPerIdentityPerSecond and
	// DefaultWatchOpenBurstPerIdentity are the defaults of
	// --watch-opens-per-identity-per-second and
	// --watch-open-burst-per-identity: off. What the API server can take
	// is bounded by the watch opens in flight (watchOpenSeats), shared
	// fairly; a fixed rate per caller would hold an agent's restart (tens
	// of thousands of watches for its users) for minutes.
	DefaultWatchOpensPerIdentityPerSecond = 0
	DefaultWatchOpenBurstPerIdentity      = 0
	// maxWatchOpenRateKeys caps the callers whose watch-open buckets are
	// tracked (48 bytes each, plus the map's own); callers beyond it share
	// one bucket until the tracked ones refill and are dropped.
	maxWatchOpenRateKeys = 16384
)

// GuardWatchOpenRate: the caller opened its burst of watches through this
// replica faster than its per-identity rate refills it; answered 429 with
// Retry-After, the time until it may open one again.
const GuardWatchOpenRate = "WatchOpenRate"

// watchOpenRate is the replica's ceiling on how fast one caller
// (authenticated identity, the same key as the watch guard's, never an
// impersonated name, so made-up impersonated users cannot multiply it)
// opens watches that go upstream: a token bucket per caller. It is asked
// only for watches its budget admitted and the guard gave a place, just
// before they are forwarded: a watch answered locally (a stale version, a
// follower that learnt its leader's 410) or refused costs nothing. A
// refused open is answered at once, holding nothing.
//
// The users behind an impersonating caller share its bucket: each has a
// bucket of its own of a quarter of the rate and burst, which an open
// must pass first, so one user cannot spend the whole of its caller's
// opens and leave none for the next.
type watchOpenRate struct {
	rate      *ratelimit.KeyRate
	users     *ratelimit.KeyRate
	perSecond float64
	burst     int
}

// perUserRateDivisor divides a caller's rate and burst into what one user
// it impersonates may open.
const perUserRateDivisor = 4

// NewWatchOpenRate returns the ceiling of perSecond opens per caller up to
// burst, or nil (no ceiling) when either is 0 (or the rate infinite).
func NewWatchOpenRate(perSecond float64, burst int) *watchOpenRate {
	if !(perSecond > 0) || math.IsInf(perSecond, 1) || burst <= 0 {
		return nil
	}
	return &watchOpenRate{
		rate:      ratelimit.NewKeyRate(perSecond, burst, maxWatchOpenRateKeys),
		users:     ratelimit.NewKeyRate(perSecond/perUserRateDivisor, max(1, burst/perUserRateDivisor), maxWatchOpenRateKeys),
		perSecond: perSecond, burst: burst,
	}
}

// allow takes one open of caller's bucket at now, and first one of its
// impersonated user's (user, "" for none), or returns the wait until it
// may open one.
func (o *watchOpenRate) allow(now time.Time, caller, user string) (time.Duration, bool) {
	if user != "" {
		if wait, ok := o.users.Allow(now, caller+"\x00"+user); !ok {
			return wait, false
		}
	}
	return o.rate.Allow(now, caller)
}

// text names the ceiling's flags and values, for a refusal's Warning.
func (o *watchOpenRate) text() string {
	return fmt.Sprintf("you opened more than --watch-open-burst-per-identity=%d watches faster than --watch-opens-per-identity-per-second=%g", o.burst, o.perSecond)
}

// refuse answers a watch open refused for wait with 429 and Retry-After:
// the wait rounded up to whole seconds, at least 1.
func (o *watchOpenRate) Refuse(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	retry := answer.RetryAfterSeconds(wait)
	guard.Rejections.WithLabelValues(GuardWatchOpenRate).Inc()
	w.Header().Set(answer.DecisionHeader, answer.FormatDecision("reject", GuardWatchOpenRate, "", retry))
	answer.WriteStatus(w, r, apierrors.NewTooManyRequests(fmt.Sprintf(
		"watchgate forwards at most its per-identity rate of watch opens on this replica and you opened yours, please try again in %ds",
		retry), retry))
}
