package proxy

import (
	"net"
	"os"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/internal/bounds"
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

// Options configure a Server. A zero duration, size, rate or burst takes
// the default named on its field, except where the field says 0 means
// none; negative values are invalid (Validate states every bound). main's
// flags set these fields as they are, so a flag given 0 means what its
// field says 0 means, and its help says the same.
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
	// waiting at once, a quarter of them per tenant (admit.DelaySlots);
	// beyond it they are answered at once. Default 4096.
	MaxRejectDelay       time.Duration
	MaxDelayedRejections int
	// MaxStaleWatchDelay bounds instead how long a watch answered locally
	// as too old waits before its answer: the engine's stale hold, which
	// grows with the budget's backoff while a client loops on a stale
	// version; default 10s, within the default shutdown drain and grace so
	// that a replica that stops answers the watches it holds.
	MaxStaleWatchDelay time.Duration

	// ShutdownDrainDelay and ShutdownGracePeriod time the shutdown; see
	// GracefulShutdownTimeout. Defaults DefaultShutdownDrainDelay and
	// DefaultShutdownGracePeriod; ShutdownGracePeriod at most
	// MaxShutdownGracePeriod.
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
	// 0: no cap (main's --max-watches defaults to MaxWatchesFor the
	// process's memory limit).
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
	// MaxWatchOpensInFlight bounds the watch opens this replica has sent
	// upstream and whose response headers are not back (a watch asking for
	// initial state: whose initial state has not passed); the others wait
	// their turn, fairly queued by tenant and flow (see guard.Flow), at
	// most 15 s, else 429 (reason="WatchOpenQueue"). 0:
	// DefaultMaxWatchOpensInFlight; negative: no bound.
	MaxWatchOpensInFlight int
	// MemoryHighWaterPercent refuses new watches with 503 and Retry-After
	// while the Go runtime's memory in use is above this percentage of its
	// memory limit (GOMEMLIMIT, or debug.SetMemoryLimit: main sets one
	// from ProcessMemoryLimit when GOMEMLIMIT is unset); without a limit
	// memory is not checked. With accounted streams only the callers
	// holding the most memory are refused (guard.Guard).
	// Open watches are never cut. 1–100, 100 disables the check; 0: the
	// default, DefaultMemoryHighWaterPercent (85).
	MemoryHighWaterPercent int
	// StalledStreamTimeout cuts a forwarded watch or list whose client
	// took none of a write for so long (watchgate_proxy_stalled_streams_cut_total);
	// default DefaultStalledStreamTimeout (30s). 0: the default; else
	// 1s–1h.
	StalledStreamTimeout time.Duration
	// MaxListsPerIdentity caps the lists one caller has in flight through
	// this replica; beyond it a list gets 429 (reason="MaxListsPerIdentity").
	// Default DefaultMaxListsPerIdentity (100). 0: the default; at most
	// 1000000.
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

// Validate reports every value of o out of its bounds, in the order of
// Options' fields, each error's path the field's name in lowerCamel case
// (main names the flag that set it instead). Zero is always valid: it is
// the default, or "none" where the field says so. Upstream and Engine are
// dependencies, not settings: NewServer requires them, so that flags can
// be checked before either exists.
func (o *Options) Validate() field.ErrorList {
	p := field.NewPath
	var errs field.ErrorList
	if o.BindAddress != "" {
		if _, _, err := net.SplitHostPort(o.BindAddress); err != nil {
			errs = append(errs, field.Invalid(p("bindAddress"), o.BindAddress, err.Error()))
		}
	}
	switch {
	case o.CertFile != "" && o.KeyFile == "":
		errs = append(errs, field.Required(p("keyFile"), "the certificate's key"))
	case o.CertFile == "" && o.KeyFile != "":
		errs = append(errs, field.Required(p("certFile"), "the key's certificate"))
	}
	errs = append(errs, bounds.NonNegative(p("readHeaderTimeout"), o.ReadHeaderTimeout)...)
	errs = append(errs, bounds.NonNegative(p("maxHeaderBytes"), o.MaxHeaderBytes)...)
	errs = append(errs, bounds.NonNegative(p("maxConcurrentStreams"), o.MaxConcurrentStreams)...)
	errs = append(errs, bounds.NonNegative(p("tokenCacheTTL"), o.TokenCacheTTL)...)
	errs = append(errs, bounds.NonNegative(p("tokenCacheNegativeTTL"), o.TokenCacheNegativeTTL)...)
	errs = append(errs, bounds.NonNegative(p("tokenCacheSize"), o.TokenCacheSize)...)
	errs = append(errs, bounds.NonNegative(p("impersonationCacheTTL"), o.ImpersonationCacheTTL)...)
	errs = append(errs, bounds.NonNegative(p("impersonationCacheNegativeTTL"), o.ImpersonationCacheNegativeTTL)...)
	errs = append(errs, bounds.NonNegative(p("impersonationCacheSize"), o.ImpersonationCacheSize)...)
	errs = append(errs, bounds.NonNegative(p("reviewsPerSecond"), o.ReviewsPerSecond)...)
	errs = append(errs, bounds.NonNegative(p("reviewBurst"), o.ReviewBurst)...)
	errs = append(errs, bounds.NonNegative(p("maxConcurrentReviews"), o.MaxConcurrentReviews)...)
	errs = append(errs, bounds.NonNegative(p("tokenReviewsPerClientPerSecond"), o.TokenReviewsPerClientPerSecond)...)
	errs = append(errs, bounds.NonNegative(p("tokenReviewClientBurst"), o.TokenReviewClientBurst)...)
	errs = append(errs, bounds.NonNegative(p("impersonationReviewsPerCallerPerSecond"), o.ImpersonationReviewsPerCallerPerSecond)...)
	errs = append(errs, bounds.NonNegative(p("impersonationReviewCallerBurst"), o.ImpersonationReviewCallerBurst)...)
	errs = append(errs, bounds.NonNegative(p("reviewRequestersTracked"), o.ReviewRequestersTracked)...)
	errs = append(errs, bounds.NonNegative(p("reviewTimeout"), o.ReviewTimeout)...)
	switch o.ReviewFailurePolicy {
	case "", review.FailClosed, review.FailOpen:
	default:
		errs = append(errs, field.NotSupported(p("reviewFailurePolicy"), o.ReviewFailurePolicy, []review.FailurePolicy{review.FailClosed, review.FailOpen}))
	}
	errs = append(errs, bounds.NonNegative(p("serviceAccountKeysRefreshInterval"), o.ServiceAccountKeysRefreshInterval)...)
	errs = append(errs, bounds.NonNegative(p("maxRejectDelay"), o.MaxRejectDelay)...)
	errs = append(errs, bounds.NonNegative(p("maxDelayedRejections"), o.MaxDelayedRejections)...)
	errs = append(errs, bounds.NonNegative(p("maxStaleWatchDelay"), o.MaxStaleWatchDelay)...)
	errs = append(errs, bounds.NonNegative(p("shutdownDrainDelay"), o.ShutdownDrainDelay)...)
	errs = append(errs, bounds.Within(p("shutdownGracePeriod"), o.ShutdownGracePeriod, 0, MaxShutdownGracePeriod)...)
	errs = append(errs, bounds.NonNegative(p("sweepInterval"), o.SweepInterval)...)
	errs = append(errs, bounds.NonNegative(p("upstreamProbeInterval"), o.UpstreamProbeInterval)...)
	errs = append(errs, bounds.NonNegative(p("maxWatches"), o.MaxWatches)...)
	if o.MaxWatches > 0 {
		errs = append(errs, bounds.Within(p("maxWatchesPerIdentity"), o.MaxWatchesPerIdentity, 0, o.MaxWatches)...)
	} else {
		errs = append(errs, bounds.NonNegative(p("maxWatchesPerIdentity"), o.MaxWatchesPerIdentity)...)
	}
	errs = append(errs, bounds.NonNegative(p("watchOpensPerIdentityPerSecond"), o.WatchOpensPerIdentityPerSecond)...)
	errs = append(errs, bounds.NonNegative(p("watchOpenBurstPerIdentity"), o.WatchOpenBurstPerIdentity)...)
	errs = append(errs, bounds.Within(p("memoryHighWaterPercent"), o.MemoryHighWaterPercent, 0, 100)...)
	errs = append(errs, bounds.NonNegative(p("maxConnections"), o.MaxConnections)...)
	if o.StalledStreamTimeout != 0 {
		errs = append(errs, bounds.Within(p("stalledStreamTimeout"), o.StalledStreamTimeout, time.Second, time.Hour)...)
	}
	errs = append(errs, bounds.Within(p("maxListsPerIdentity"), o.MaxListsPerIdentity, 0, 1000000)...)
	return errs
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
	def(&o.MaxStaleWatchDelay, 10*time.Second)
	defInt(&o.MaxDelayedRejections, 4096)
	def(&o.ShutdownDrainDelay, DefaultShutdownDrainDelay)
	def(&o.ShutdownGracePeriod, DefaultShutdownGracePeriod)
	def(&o.SweepInterval, 30*time.Second)
	def(&o.UpstreamProbeInterval, 10*time.Second)
	defInt(&o.MemoryHighWaterPercent, guard.DefaultMemoryHighWaterPercent)
	defInt(&o.MaxWatchOpensInFlight, DefaultMaxWatchOpensInFlight)
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
	// MaxShutdownGracePeriod bounds ShutdownGracePeriod: past it a
	// rolling update waits on each replica longer than any client's
	// patience.
	MaxShutdownGracePeriod = 10 * time.Minute
	shutdownRequestsGrace  = 5 * time.Second
	shutdownMargin         = 5 * time.Second
)

// GracefulShutdownTimeout is how long Start may take after its context
// ended, with o's timings (defaults filled in), plus a margin: the
// manager's GracefulShutdownTimeout.
func (o Options) GracefulShutdownTimeout() time.Duration {
	c := o.complete()
	return c.ShutdownDrainDelay + c.ShutdownGracePeriod + shutdownRequestsGrace + shutdownMargin
}
