package proxy

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/ratelimit"
)

// Engine is the part of *ratelimit.Engine the proxy uses.
type Engine interface {
	Decide(now time.Time, r *ratelimit.Request) ratelimit.Decision
	WatchEnded(now time.Time, w ratelimit.Watch, lifetime time.Duration, outcome ratelimit.Outcome)
	StaleVersionSeen(now time.Time, group, resource, resourceVersion string)
	Sweep(now time.Time) (evicted int)
}

// DefaultMaxHeaderBytes is Options.MaxHeaderBytes's default, 64 KiB.
const DefaultMaxHeaderBytes = 64 << 10

// Options configure a Server. Zero durations and sizes take the defaults
// named on each field; negative ones are invalid.
type Options struct {
	// BindAddress is host:port to serve HTTPS on (--proxy-bind-address);
	// default ":8443". Port 0 picks a free port (see Server.Addr).
	BindAddress string
	// CertFile and KeyFile are the serving certificate and key in PEM
	// (--tls-cert-file, --tls-private-key-file), reloaded when they change.
	// Both empty: a self-signed pair is generated at start.
	CertFile, KeyFile string
	// Upstream is the API server. Its host and CA are used to forward; its
	// credentials are used only for the proxy's own TokenReviews,
	// SubjectAccessReviews and readiness probe, never for a forwarded
	// request.
	Upstream *rest.Config
	// Engine decides every watch and list; usually a *ratelimit.Engine.
	Engine Engine
	// ReplicaName names this replica in the top endpoint's answer (main's
	// --pod-name); default the host name.
	ReplicaName string
	// Logger receives the proxy's logs as is (name it, e.g. "proxy");
	// decision and error logs are rate limited.
	Logger logr.Logger

	// ReadHeaderTimeout bounds how long a client may take to send request
	// headers; default 10s.
	ReadHeaderTimeout time.Duration
	// MaxHeaderBytes bounds a request's header block (names, values and
	// the request line; over HTTP/2 the header list); default 64 KiB.
	// Real clients need a few KiB: a service-account token is ~1 KiB, an
	// OIDC token a few KiB, an agent impersonating a user in 200 groups
	// ~15 KiB. Go's and kube-apiserver's own 1 MiB lets every slow or
	// hostile connection pin up to 1 MiB; Envoy's default is 60 KiB,
	// nginx's 32 KiB. Larger headers get 431.
	MaxHeaderBytes int
	// MaxConcurrentStreams is the HTTP/2 stream limit per client
	// connection (each watch is a stream); default 1000, like kube-apiserver.
	MaxConcurrentStreams int

	// TokenCacheTTL is how long an authenticated token is trusted without a
	// new TokenReview; default 2m. TokenCacheNegativeTTL is the same for a
	// rejected token; default 10s. TokenCacheSize bounds the cache (LRU);
	// default 32768.
	TokenCacheTTL, TokenCacheNegativeTTL time.Duration
	TokenCacheSize                       int
	// ImpersonationCacheTTL and ImpersonationCacheNegativeTTL are how long
	// an allowed or denied impersonation check (SubjectAccessReview) is
	// remembered, and a check of a top endpoint's caller; defaults 1m and
	// 10s. ImpersonationCacheSize bounds it;
	// default 8192.
	ImpersonationCacheTTL, ImpersonationCacheNegativeTTL time.Duration
	ImpersonationCacheSize                               int
	// ReviewsPerSecond and ReviewBurst bound the TokenReviews (and,
	// separately, the SubjectAccessReviews) sent on cache misses, so that a
	// flood of random tokens cannot become a flood of reviews: over the
	// limit a request gets 429 with Retry-After. Defaults 50 and 100.
	// MaxConcurrentReviews caps reviews in flight; default 16.
	ReviewsPerSecond     float64
	ReviewBurst          int
	MaxConcurrentReviews int
	// TokenReviewsPerClientPerSecond and TokenReviewClientBurst are each
	// client network's (IPv4 /24, IPv6 /64) own TokenReview bucket, taken
	// before the shared one, so that one network flooding random tokens
	// spends at most this rate of the shared budget; defaults 5 and 20.
	// Tokens found valid in the last 30 minutes revalidate through a
	// reserved bucket of a quarter of ReviewsPerSecond and ReviewBurst
	// instead.
	TokenReviewsPerClientPerSecond float64
	TokenReviewClientBurst         int
	// ImpersonationReviewsPerCallerPerSecond and
	// ImpersonationReviewCallerBurst are each caller's own
	// SubjectAccessReview bucket; defaults 20 and 200 (an agent that
	// impersonates a user checks the user, each group and each extra).
	// Callers allowed an impersonation in the last 10 minutes use only
	// their own bucket, so others cannot starve them.
	ImpersonationReviewsPerCallerPerSecond float64
	ImpersonationReviewCallerBurst         int
	// ReviewRequestersTracked bounds the per-client and per-caller review
	// buckets kept (LRU, each); default 4096.
	ReviewRequestersTracked int
	// ReviewTimeout bounds one TokenReview or SubjectAccessReview; default
	// 10s. ReviewFailurePolicy says what a request gets when its review
	// fails or times out: FailClosed (default, 503 with Retry-After) or
	// FailOpen (see FailOpen for whom it is charged to).
	ReviewTimeout       time.Duration
	ReviewFailurePolicy review.FailurePolicy

	// LocalServiceAccountTokens verifies the API server's service-account
	// JWTs locally against its published keys instead of with a
	// TokenReview (default true; see serviceAccountTokens). Only the
	// budget identity depends on it: the API server authenticates every
	// forwarded request itself. Nil means true.
	LocalServiceAccountTokens *bool
	// ServiceAccountAudiences are the audiences a locally verified token
	// must name one of; default the issuer (kube-apiserver's default
	// --api-audiences). Tokens for other audiences are reviewed.
	ServiceAccountAudiences []string
	// ServiceAccountKeysRefreshInterval is how often the issuer's keys are
	// fetched again; default 5m. Unknown key ids on otherwise acceptable
	// tokens fetch them too, at most once per 10s per client network and
	// once a second in all.
	ServiceAccountKeysRefreshInterval time.Duration

	// MaxRejectDelay bounds how long a rejected request waits before its
	// answer (the engine's retry-after, capped), so that clients retrying at
	// once are slowed; default 1s. MaxDelayedRejections caps rejections
	// waiting at once; beyond it they are answered at once. Default 4096.
	MaxRejectDelay       time.Duration
	MaxDelayedRejections int

	// ShutdownDrainDelay and ShutdownGracePeriod time the shutdown; see
	// GracefulShutdownTimeout. Defaults DefaultShutdownDrainDelay and
	// DefaultShutdownGracePeriod.
	ShutdownDrainDelay  time.Duration
	ShutdownGracePeriod time.Duration
	// SweepInterval is how often engine.Sweep runs; default 30s.
	SweepInterval time.Duration
	// UpstreamProbeInterval is how often readiness probes the API server's
	// /readyz; default 10s.
	UpstreamProbeInterval time.Duration

	// MaxWatches caps the watches this replica forwards at once, whatever
	// the budgets say; beyond it a watch open gets 429 with Retry-After
	// (watchgate_proxy_guard_rejections_total{reason="MaxWatches"}).
	// 0: no cap (main's --max-watches defaults to DefaultMaxWatches).
	MaxWatches int
	// MaxWatchesPerIdentity caps the watches one caller (authenticated
	// identity, whoever it impersonates) holds through this replica at
	// once; beyond it a watch open gets 429 with Retry-After
	// (reason="MaxWatchesPerIdentity"). 0: a quarter of MaxWatches, so that
	// one caller never fills a replica (none without MaxWatches); at most
	// MaxWatches. Near MaxWatches
	// or the memory mark each caller is also held to its fair share (see
	// guard.Guard).
	MaxWatchesPerIdentity int
	// WatchOpensPerIdentityPerSecond and WatchOpenBurstPerIdentity cap how
	// fast one caller (authenticated identity, whoever it impersonates)
	// opens watches that this replica forwards upstream: a token bucket
	// per caller of that rate and burst; beyond it a watch open gets 429
	// with Retry-After, the time until its next token
	// (reason="WatchOpenRate"). Watches answered locally are not counted.
	// 0 for either: no ceiling (main's flags default to
	// DefaultWatchOpensPerIdentityPerSecond and
	// DefaultWatchOpenBurstPerIdentity).
	WatchOpensPerIdentityPerSecond float64
	WatchOpenBurstPerIdentity      int
	// MemoryHighWaterPercent refuses new watches with 503 and Retry-After
	// while the Go runtime's memory in use is above this percentage of its
	// memory limit (GOMEMLIMIT); without a limit memory is not checked.
	// With accounted streams only the callers holding the most memory are
	// refused (guard.Guard). Default DefaultMemoryHighWaterPercent
	// (85); 1–100, 100 disables the check.
	MemoryHighWaterPercent int
	// StalledStreamTimeout cuts a forwarded watch or list whose client
	// took none of a write for so long (watchgate_proxy_stalled_streams_cut_total);
	// default DefaultStalledStreamTimeout (30s).
	StalledStreamTimeout time.Duration
	// MaxListsPerIdentity caps the lists one caller has in flight through
	// this replica; beyond it a list gets 429 (reason="MaxListsPerIdentity").
	// Default DefaultMaxListsPerIdentity (100).
	MaxListsPerIdentity int
	// MaxConnections caps the client connections held open at once;
	// beyond it new ones wait in the kernel's accept queue
	// (watchgate_proxy_connections). 0: no cap (main's --max-connections
	// defaults to DefaultMaxConnections).
	MaxConnections int

	// The following are used for testing purposes.

	// MemoryReader reads memory in use and its limit for the watch guard;
	// default RuntimeMemory.
	MemoryReader guard.MemoryReader
	// Clock is the time source for decisions; default the real clock.
	Clock clock.Clock
	// Reviews is the API server the proxy's own TokenReviews,
	// SubjectAccessReviews and key fetches go to; default Upstream.
	Reviews *rest.Config
}

// negatives reports each of values below zero, in the order of their
// names.
func negatives[T time.Duration | int | float64](values map[string]T) []error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(values)) {
		if v := values[name]; v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative, got %v", name, v))
		}
	}
	return errs
}

// Validate reports every problem with the options at once, always in the
// same order: the required fields, then the negative durations, counts and
// rates, each kind in the order of its names.
func (o *Options) Validate() error {
	var errs []error
	if o.Upstream == nil {
		errs = append(errs, errors.New("upstream: required"))
	}
	if o.Engine == nil {
		errs = append(errs, errors.New("engine: required"))
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		errs = append(errs, errors.New("certFile and keyFile: set both or neither"))
	}
	durations := map[string]time.Duration{
		"readHeaderTimeout":             o.ReadHeaderTimeout,
		"tokenCacheTTL":                 o.TokenCacheTTL,
		"tokenCacheNegativeTTL":         o.TokenCacheNegativeTTL,
		"impersonationCacheTTL":         o.ImpersonationCacheTTL,
		"impersonationCacheNegativeTTL": o.ImpersonationCacheNegativeTTL,
		"maxRejectDelay":                o.MaxRejectDelay,
		"shutdownDrainDelay":            o.ShutdownDrainDelay,
		"shutdownGracePeriod":           o.ShutdownGracePeriod,
		"sweepInterval":                 o.SweepInterval,
		"upstreamProbeInterval":         o.UpstreamProbeInterval,
		"reviewTimeout":                 o.ReviewTimeout,
		"serviceAccountKeysRefresh":     o.ServiceAccountKeysRefreshInterval,
	}
	errs = append(errs, negatives(durations)...)
	counts := map[string]int{
		"maxHeaderBytes":                 o.MaxHeaderBytes,
		"maxConcurrentStreams":           o.MaxConcurrentStreams,
		"tokenCacheSize":                 o.TokenCacheSize,
		"impersonationCacheSize":         o.ImpersonationCacheSize,
		"reviewBurst":                    o.ReviewBurst,
		"maxConcurrentReviews":           o.MaxConcurrentReviews,
		"maxDelayedRejections":           o.MaxDelayedRejections,
		"tokenReviewClientBurst":         o.TokenReviewClientBurst,
		"impersonationReviewCallerBurst": o.ImpersonationReviewCallerBurst,
		"reviewRequestersTracked":        o.ReviewRequestersTracked,
		"maxWatches":                     o.MaxWatches,
		"maxConnections":                 o.MaxConnections,
		"watchOpenBurstPerIdentity":      o.WatchOpenBurstPerIdentity,
	}
	errs = append(errs, negatives(counts)...)
	rates := map[string]float64{
		"reviewsPerSecond":                       o.ReviewsPerSecond,
		"tokenReviewsPerClientPerSecond":         o.TokenReviewsPerClientPerSecond,
		"impersonationReviewsPerCallerPerSecond": o.ImpersonationReviewsPerCallerPerSecond,
		"watchOpensPerIdentityPerSecond":         o.WatchOpensPerIdentityPerSecond,
	}
	errs = append(errs, negatives(rates)...)
	switch o.ReviewFailurePolicy {
	case "", review.FailClosed, review.FailOpen:
	default:
		errs = append(errs, fmt.Errorf("reviewFailurePolicy: must be %q or %q, got %q", review.FailClosed, review.FailOpen, o.ReviewFailurePolicy))
	}
	if o.MaxWatchesPerIdentity < 0 || (o.MaxWatches > 0 && o.MaxWatchesPerIdentity > o.MaxWatches) {
		errs = append(errs, fmt.Errorf("maxWatchesPerIdentity: must be within 0–maxWatches (0: a quarter of maxWatches), got %d", o.MaxWatchesPerIdentity))
	}
	if o.MemoryHighWaterPercent < 0 || o.MemoryHighWaterPercent > 100 {
		errs = append(errs, fmt.Errorf("memoryHighWaterPercent: must be within 1–100 (0: default), got %d", o.MemoryHighWaterPercent))
	}
	return errors.Join(errs...)
}

// complete returns a copy of o with every default filled in.
func (o Options) complete() Options {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if o.BindAddress == "" {
		o.BindAddress = ":8443"
	}
	def(&o.ReadHeaderTimeout, 10*time.Second)
	defInt(&o.MaxHeaderBytes, DefaultMaxHeaderBytes)
	defInt(&o.MaxConcurrentStreams, 1000)
	def(&o.TokenCacheTTL, 2*time.Minute)
	def(&o.TokenCacheNegativeTTL, 10*time.Second)
	defInt(&o.TokenCacheSize, 32768)
	def(&o.ImpersonationCacheTTL, time.Minute)
	def(&o.ImpersonationCacheNegativeTTL, 10*time.Second)
	defInt(&o.ImpersonationCacheSize, 8192)
	if o.ReviewsPerSecond == 0 {
		o.ReviewsPerSecond = 50
	}
	defInt(&o.ReviewBurst, 100)
	defInt(&o.MaxConcurrentReviews, 16)
	if o.TokenReviewsPerClientPerSecond == 0 {
		o.TokenReviewsPerClientPerSecond = 5
	}
	defInt(&o.TokenReviewClientBurst, 20)
	if o.ImpersonationReviewsPerCallerPerSecond == 0 {
		o.ImpersonationReviewsPerCallerPerSecond = 20
	}
	defInt(&o.ImpersonationReviewCallerBurst, 200)
	defInt(&o.ReviewRequestersTracked, 4096)
	def(&o.ReviewTimeout, 10*time.Second)
	if o.ReviewFailurePolicy == "" {
		o.ReviewFailurePolicy = review.FailClosed
	}
	if o.LocalServiceAccountTokens == nil {
		yes := true
		o.LocalServiceAccountTokens = &yes
	}
	def(&o.ServiceAccountKeysRefreshInterval, 5*time.Minute)
	if o.Reviews == nil {
		o.Reviews = o.Upstream
	}
	def(&o.MaxRejectDelay, time.Second)
	defInt(&o.MaxDelayedRejections, 4096)
	def(&o.ShutdownDrainDelay, DefaultShutdownDrainDelay)
	def(&o.ShutdownGracePeriod, DefaultShutdownGracePeriod)
	def(&o.SweepInterval, 30*time.Second)
	def(&o.UpstreamProbeInterval, 10*time.Second)
	defInt(&o.MemoryHighWaterPercent, guard.DefaultMemoryHighWaterPercent)
	defInt(&o.MaxListsPerIdentity, guard.DefaultMaxListsPerIdentity)
	def(&o.StalledStreamTimeout, guard.DefaultStalledStreamTimeout)
	if o.MaxWatchesPerIdentity == 0 {
		o.MaxWatchesPerIdentity = guard.DefaultMaxWatchesPerIdentity(o.MaxWatches)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.ReplicaName == "" {
		o.ReplicaName, _ = os.Hostname()
	}
	return o
}

// Shutdown timing, all of it. When the manager's context ends, Start
//  1. drops readiness and keeps serving for ShutdownDrainDelay, so that load
//     balancers stop sending new clients (default 5s);
//  2. stops accepting connections and closes open watches one by one over
//     ShutdownGracePeriod, so that their clients do not all reconnect to the
//     other replicas at once (default 30s, as --shutdown-grace-period);
//  3. waits at most shutdownRequestsGrace more for the other requests, then
//     closes what is still open.
//
// The manager must give Start that long and a little more:
// GracefulShutdownTimeout, 45s with the defaults.
const (
	DefaultShutdownDrainDelay  = 5 * time.Second
	DefaultShutdownGracePeriod = 30 * time.Second
	shutdownRequestsGrace      = 5 * time.Second
	shutdownMargin             = 5 * time.Second
)

// GracefulShutdownTimeout is how long Start may take after its context
// ended, with o's timings (defaults filled in), plus a margin: the
// manager's GracefulShutdownTimeout.
func (o Options) GracefulShutdownTimeout() time.Duration {
	c := o.complete()
	return c.ShutdownDrainDelay + c.ShutdownGracePeriod + shutdownRequestsGrace + shutdownMargin
}
