package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/watchgate/watchgate/internal/periodic"
	"github.com/watchgate/watchgate/proxy/internal/admit"
	"github.com/watchgate/watchgate/proxy/internal/authn"
	"github.com/watchgate/watchgate/proxy/internal/coalesce"
	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/proxy/internal/identity"
	"github.com/watchgate/watchgate/proxy/internal/relay"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
	"github.com/watchgate/watchgate/proxy/internal/serve"
	"github.com/watchgate/watchgate/proxy/internal/top"
	"github.com/watchgate/watchgate/proxy/internal/upstream"
)

// Server is the proxy: an HTTPS server (HTTP/2 and HTTP/1.1) in front of
// the API server. It is a controller-runtime Runnable that runs on every
// replica (NeedLeaderElection is false); add ReadyCheck to the manager's
// readiness checks.
//
//	srv, err := proxy.NewServer(proxy.Options{...})
//	mgr.Add(srv)
//	mgr.AddReadyzCheck("proxy", srv.ReadyCheck)
type Server struct {
	opts     Options
	log      logr.Logger
	handler  http.Handler
	cert     *serve.Certificate
	watches  *relay.OpenWatches
	client   kubernetes.Interface
	errorLog *log.Logger

	addr     atomic.Pointer[net.Addr]
	draining atomic.Bool
	// upstreamErr is the last readiness probe's result; errNotProbed
	// until the first probe.
	upstreamMu  sync.Mutex
	upstreamErr error

	// saTokens verifies service-account tokens locally; nil when off.
	saTokens *authn.ServiceAccountTokens
	keyLogs  *sampledlog.Logger
	// upstreamConns counts the forwarder's connections to the API server.
	upstreamConns *upstream.ConnectionCount
	// upstream is the forwarder's transport, whose connections Start
	// closes when it has shut down.
	upstream interface{ CloseIdleConnections() }
	// guard is the replica's watch guard, whose streams Start sweeps.
	guard *guard.Guard
}

var (
	_ manager.Runnable               = (*Server)(nil)
	_ manager.LeaderElectionRunnable = (*Server)(nil)
)

var errNotProbed = errors.New("the API server has not been probed yet")

// NewServer validates opts, requires its Upstream and Engine, and builds
// the proxy's handler chain once. It does not listen; Start does.
func NewServer(opts Options) (*Server, error) {
	var errs field.ErrorList
	if opts.Upstream == nil {
		errs = append(errs, field.Required(field.NewPath("upstream"), ""))
	}
	if opts.Engine == nil {
		errs = append(errs, field.Required(field.NewPath("engine"), ""))
	}
	if errs = append(errs, opts.Validate()...); len(errs) > 0 {
		return nil, fmt.Errorf("invalid proxy options: %w", errs.ToAggregate())
	}
	o := opts.complete()
	lg := o.Logger

	// The proxy's own clients: TokenReviews, SubjectAccessReviews and
	// service-account keys (Reviews), the readiness probe (Upstream).
	// Reviews are rate limited by review.Cache, so the clients' own
	// limiters are off.
	own := rest.CopyConfig(o.Reviews)
	own.QPS, own.Burst = -1, -1
	client, err := kubernetes.NewForConfig(own)
	if err != nil {
		return nil, fmt.Errorf("proxy client: %w", err)
	}
	probeConfig := rest.CopyConfig(o.Upstream)
	probeConfig.QPS, probeConfig.Burst = -1, -1
	probe, err := kubernetes.NewForConfig(probeConfig)
	if err != nil {
		return nil, fmt.Errorf("proxy probe client: %w", err)
	}
	conns := &upstream.ConnectionCount{}
	target, transport, err := upstream.NewTransport(o.Upstream, conns, relay.ForwardedWatch)
	if err != nil {
		return nil, err
	}
	cert, err := serve.NewCertificate(o.CertFile, o.KeyFile)
	if err != nil {
		return nil, err
	}

	errorLogs := sampledlog.New(lg.WithName("http").V(1), 5, 20)
	decisionLogs := sampledlog.New(lg.WithName("decisions"), 10, 50)
	errorLog := errorLogs.StdLogger()

	// The caches and review budgets, one per line. Token reviews have
	// their own budget, fair per client network, with a share reserved
	// for tokens valid recently; SubjectAccessReviews for impersonation
	// and for the top endpoint share one budget per caller and one shared
	// budget, so that reading the top endpoint cannot become a second
	// flood of reviews.
	tokenBudget := review.NewBudget(o.ReviewsPerSecond, o.ReviewBurst, o.TokenReviewsPerClientPerSecond, o.TokenReviewClientBurst, o.ReviewRequestersTracked).
		WithReserve(o.ReviewsPerSecond*authn.RecentTokensShare, int(float64(o.ReviewBurst)*authn.RecentTokensShare))
	tokenReviews := review.NewCache("token", o.TokenCacheSize, tokenBudget, o.MaxConcurrentReviews, o.ReviewTimeout, o.Clock)
	recentTokens := utilcache.NewLRUExpireCacheWithClock(max(1, o.TokenCacheSize/4), o.Clock)
	sarBudget := review.NewBudget(o.ReviewsPerSecond, o.ReviewBurst, o.ImpersonationReviewsPerCallerPerSecond, o.ImpersonationReviewCallerBurst, o.ReviewRequestersTracked)
	impersonationReviews := review.NewCache("impersonation", o.ImpersonationCacheSize, sarBudget, o.MaxConcurrentReviews, o.ReviewTimeout, o.Clock)
	accessReviews := review.NewCache("access", top.MaxAccessAnswers, sarBudget, max(1, o.MaxConcurrentReviews/4), o.ReviewTimeout, o.Clock)
	knownImpersonators := utilcache.NewLRUExpireCacheWithClock(o.ReviewRequestersTracked, o.Clock)

	// Who the caller is: service-account tokens verified locally when on,
	// every other token by TokenReview.
	reviewed := authn.CachedTokens(authn.TokenReviewer(client.AuthenticationV1().TokenReviews()), tokenReviews, recentTokens,
		o.TokenCacheTTL, o.TokenCacheNegativeTTL, authn.RecentTokensTTL)
	var saTokens *authn.ServiceAccountTokens
	if *o.LocalServiceAccountTokens {
		meta, err := metadata.NewForConfig(own)
		if err != nil {
			return nil, fmt.Errorf("proxy metadata client: %w", err)
		}
		lookups := review.NewBudget(o.ReviewsPerSecond, o.ReviewBurst, o.TokenReviewsPerClientPerSecond, o.TokenReviewClientBurst, o.ReviewRequestersTracked)
		bound := authn.NewBoundObjects(meta, o.TokenCacheSize, o.TokenCacheTTL, o.TokenCacheNegativeTTL, o.ReviewTimeout, lookups, o.Clock)
		saTokens = authn.NewServiceAccountTokens(client.Discovery().RESTClient(), o.ServiceAccountAudiences, o.Clock, o.TokenCacheSize, o.TokenCacheTTL, bound)
	}
	tokens := authn.LocalThenReviewed(saTokens, reviewed, o.Clock)

	// Who may impersonate whom, and who may read the top endpoint.
	sars := identity.SubjectAccessReviewer(client.AuthorizationV1().SubjectAccessReviews())
	impersonation := identity.CachedAuthorizer(sars, impersonationReviews, knownImpersonators, o.ImpersonationCacheTTL, o.ImpersonationCacheNegativeTTL)
	access := identity.CachedAuthorizer(sars, accessReviews, knownImpersonators, o.ImpersonationCacheTTL, o.ImpersonationCacheNegativeTTL)
	topEndpoint := top.NewEndpoint(o.Engine, access, o.ReplicaName, o.Clock, errorLogs)

	// Admission: the budget, then the replica's share of watches.
	watches := relay.NewOpenWatches()
	replicaGuard := guard.New(o.MaxWatches, o.MaxWatchesPerIdentity, o.MemoryHighWaterPercent, o.MemoryReader, o.Clock)
	replicaGuard.Streams = guard.NewStreams(o.StalledStreamTimeout, o.MaxListsPerIdentity)
	opens := admit.NewWatchOpenRate(o.WatchOpensPerIdentityPerSecond, o.WatchOpenBurstPerIdentity)
	seats := admit.NewWatchOpenSeats(o.MaxWatchOpensInFlight, o.Clock)
	warnings := admit.NewWarningLimiter(admit.WarningInterval, admit.MaxWarnedIdentities)
	adm := &admit.Admission{
		Engine: o.Engine, Clock: o.Clock, Watches: watches, Log: decisionLogs,
		MaxDelay: o.MaxRejectDelay, MaxStaleDelay: o.MaxStaleWatchDelay, DelaySlots: admit.NewDelaySlots(o.MaxDelayedRejections),
		Coalescer: coalesce.New(), QuietWindow: coalesce.LeaderQuietWindow, FollowerWait: coalesce.FollowerWait,
		Guard: replicaGuard, Seats: seats, Opens: opens, Warnings: warnings,
	}
	forward := upstream.NewReverseProxy(target, transport, errorLog, errorLogs, relay.ForwardedWatch)
	h := chain(tokens, impersonation, o.ReviewFailurePolicy, adm, topEndpoint, errorLogs, forward)
	return &Server{
		opts: o, log: lg, handler: h, cert: cert, watches: watches, client: probe, errorLog: errorLog,
		upstreamErr: errNotProbed, saTokens: saTokens, keyLogs: errorLogs, upstreamConns: conns,
		upstream: transport.(upstream.Transport), guard: replicaGuard,
	}, nil
}

// NeedLeaderElection is false: every replica serves.
func (s *Server) NeedLeaderElection() bool { return false }

// Addr is the address the proxy listens on, nil before Start bound it.
func (s *Server) Addr() net.Addr {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return nil
}

// UpstreamConnections is the number of TCP connections the proxy's
// forwarder holds open to the API server (the proxy's own clients, for
// reviews and probes, not counted).
func (s *Server) UpstreamConnections() int { return int(s.upstreamConns.Open.Load()) }

// GeneratedCertificate returns the PEM of the generated serving certificate
// and its CA when no certificate files were given, else nil.
func (s *Server) GeneratedCertificate() []byte { return s.cert.GeneratedCA }

// ReadyCheck is a healthz.Checker for the manager's /readyz: ready while
// the proxy serves, the API server's /readyz answers, and shutdown has not
// begun.
func (s *Server) ReadyCheck(_ *http.Request) error {
	if s.draining.Load() {
		return errors.New("proxy is shutting down")
	}
	if s.Addr() == nil {
		return errors.New("proxy is not serving yet")
	}
	s.upstreamMu.Lock()
	defer s.upstreamMu.Unlock()
	return s.upstreamErr
}

// Start serves until ctx ends, then shuts down gracefully as
// GracefulShutdownTimeout describes.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.BindAddress)
	if err != nil {
		return fmt.Errorf("proxy listen on %s: %w", s.opts.BindAddress, err)
	}
	ln = serve.LimitConnections(ln, s.opts.MaxConnections, s.opts.MaxConnections/serve.ConnectionsPerNetworkDivisor, serve.UnauthenticatedTimeout)
	srv := &http.Server{
		Handler:           s.handler,
		ConnContext:       serve.ConnContext,
		ReadHeaderTimeout: s.opts.ReadHeaderTimeout,
		MaxHeaderBytes:    s.opts.MaxHeaderBytes,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          s.errorLog,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: s.cert.GetCertificate,
		},
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: s.opts.MaxConcurrentStreams},
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetHTTP2(true)
	if err := serve.HTTP2(srv, s.handler); err != nil {
		return fmt.Errorf("proxy HTTP/2: %w", err)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	bg, stopBackground := context.WithCancel(ctx)
	defer stopBackground()
	if s.cert.Watch != nil {
		wg.Go(func() {
			if err := s.cert.Watch(bg); err != nil {
				s.log.Error(err, "Serving certificate watcher stopped")
			}
		})
	}
	wg.Go(func() { s.sweep(bg) })
	wg.Go(func() { s.guard.RunSweeps(bg) })
	wg.Go(func() { s.probeUpstream(bg) })
	if s.saTokens != nil {
		wg.Go(func() { s.saTokens.Run(bg, s.opts.Clock, s.opts.ServiceAccountKeysRefreshInterval, s.keyLogs) })
		wg.Go(func() { s.saTokens.WatchBoundObjects(bg, s.log.WithName("bound-objects")) })
	}

	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	a := ln.Addr()
	s.addr.Store(&a)
	s.log.Info("Serving", "address", a.String())

	select {
	case err := <-served:
		return fmt.Errorf("proxy serve: %w", err)
	case <-ctx.Done():
	}

	s.draining.Store(true)
	s.log.Info("Shutting down", "drainDelay", s.opts.ShutdownDrainDelay, "gracePeriod", s.opts.ShutdownGracePeriod,
		"openWatches", s.watches.Len())
	s.opts.Clock.Sleep(s.opts.ShutdownDrainDelay)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownGracePeriod+shutdownRequestsGrace)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(shutdownCtx) }()
	s.watches.CloseSpread(s.opts.Clock, s.opts.ShutdownGracePeriod)
	if err := <-shut; err != nil {
		_ = srv.Close()
		s.log.Info("Closed connections still open after the grace period", "err", err.Error())
	}
	// Once Shutdown or Close has run, ServeTLS returns http.ErrServerClosed.
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		s.log.Info("Serving ended with an error", "err", fmt.Sprint(err))
	}
	s.upstream.CloseIdleConnections()
	s.log.Info("Stopped")
	return nil
}

// sweep runs engine.Sweep every SweepInterval.
func (s *Server) sweep(ctx context.Context) {
	periodic.Every(ctx, s.opts.Clock, s.opts.SweepInterval, func(context.Context) {
		if n := s.opts.Engine.Sweep(s.opts.Clock.Now()); n > 0 {
			s.log.V(2).Info("Swept idle state", "evicted", n)
		}
	})
}

// probeUpstream asks the API server's /readyz, through the proxy's own
// client, now and every UpstreamProbeInterval.
func (s *Server) probeUpstream(ctx context.Context) {
	periodic.NowAndEvery(ctx, s.opts.Clock, s.opts.UpstreamProbeInterval, func(ctx context.Context) {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := s.client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(pctx).Error()
		cancel()
		if err != nil {
			err = fmt.Errorf("API server not ready: %w", err)
		}
		s.upstreamMu.Lock()
		s.upstreamErr = err
		s.upstreamMu.Unlock()
	})
}
