// Command watchgate keeps Kubernetes API servers alive through watch storms.
//
// It is one binary: a controller-runtime manager that compiles WatchBudgets
// into the rate-limit engine's policy and writes their status, and an HTTPS
// proxy in front of kube-apiserver that admits or rejects every watch like an
// admission step. Clients change nothing but the server URL. With
// --webhook-port it also routes in-cluster agents through the proxy (the pod
// webhook and CA publisher). StackBallast (stackballast.go) tunes the
// process's runtime for the goroutines net/http starts per request.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	watchgatev1alpha1 "github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/inject"
	"github.com/watchgate/watchgate/internal/bounds"
	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// Leader election records core Events about its Lease, in the Lease's
// namespace (the pod's own).
// +kubebuilder:rbac:groups="",namespace=watchgate-system,resources=events,verbs=create;patch

// The metrics server authenticates and authorizes its scrapers
// (--metrics-secure) with TokenReviews and SubjectAccessReviews.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// What each replica runs (--mode).
const (
	// modeAll is the proxy, the budget controllers and, with
	// --webhook-port, the injection webhook and CA publisher.
	modeAll = "all"
	// modeProxy is the proxy and the budget controllers, never injection.
	modeProxy = "proxy"
	// modeInjector is the injection webhook and CA publisher only: the
	// chart's separate injector Deployment, whose memory and permissions
	// are apart from the data plane's.
	modeInjector = "injector"
)

// version is stamped at build time (-ldflags "-X main.version=...").
var version = "dev"

// options are watchgate's command-line flags: Options → Validate → Complete
// → Run, as kube-rbac-proxy does.
type options struct {
	mode               string
	kubeconfig         string
	metricsBindAddress string
	metricsSecure      bool
	probeBindAddress   string
	pprofBindAddress   string
	leaderElect        bool
	leaderElectionNS   string
	podName            string
	podNamespace       string
	upstreamTimeout    time.Duration
	// proxy holds the proxy's flags (proxyFlags names them); run adds
	// what is not a flag (Upstream, Engine, Logger, ReplicaName).
	proxy proxy.Options
	// memoryLimit is what the default of --max-watches is derived from.
	memoryLimit proxy.MemoryLimit
	// bootstrapBudgets is --bootstrap-budgets as given; bootstrap is it
	// parsed (by validate).
	bootstrapBudgets string
	bootstrap        []controllers.BootstrapBudget

	// Injection (package inject): on when webhookPort > 0.
	webhookPort       int
	webhookCertFile   string
	webhookKeyFile    string
	caFile            string
	injectServiceHost string
	injectServicePort int
	clusterDomain     string

	// shareBudgets, with leaderElect, makes the replicas share each budget
	// (controllers.ShareReporter); replicas is how many are expected.
	shareBudgets bool
	replicas     int

	zap zap.Options
}

// proxyFlags names the flag of each proxy.Options field main sets from
// the command line, by the field's path in proxy.Options.Validate's
// errors, so that an out-of-bounds value is reported under its flag's
// name. Validate holds the bounds; a flag of the proxy is its
// fs.XVar(&o.proxy.Field, …) line in addFlags and its row here.
var proxyFlags = map[string]string{
	"bindAddress":                            "proxy-bind-address",
	"certFile":                               "tls-cert-file",
	"keyFile":                                "tls-private-key-file",
	"maxHeaderBytes":                         "max-header-bytes",
	"reviewFailurePolicy":                    "review-failure-policy",
	"reviewTimeout":                          "review-timeout",
	"tokenReviewsPerClientPerSecond":         "token-reviews-per-client-per-second",
	"tokenReviewClientBurst":                 "token-review-client-burst",
	"impersonationReviewsPerCallerPerSecond": "impersonation-reviews-per-caller-per-second",
	"impersonationReviewCallerBurst":         "impersonation-review-caller-burst",
	"localServiceAccountTokens":              "local-service-account-tokens",
	"serviceAccountAudiences":                "service-account-audiences",
	"shutdownGracePeriod":                    "shutdown-grace-period",
	"maxWatches":                             "max-watches",
	"maxWatchesPerIdentity":                  "max-watches-per-identity",
	"watchOpensPerIdentityPerSecond":         "watch-opens-per-identity-per-second",
	"watchOpenBurstPerIdentity":              "watch-open-burst-per-identity",
	"maxWatchOpensInFlight":                  "max-watch-opens-in-flight",
	"maxConnections":                         "max-connections",
	"memoryHighWaterPercent":                 "memory-high-water-percent",
	"stalledStreamTimeout":                   "stalled-stream-timeout",
	"maxListsPerIdentity":                    "max-lists-per-identity",
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.mode, "mode", modeAll, "What this process runs: all (the proxy, the budget controllers and, with --webhook-port, pod injection), proxy (no injection), or injector (the injection webhook and CA publisher only, as a Deployment of their own).")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig for the upstream API server and watchgate's own client. Empty: in-cluster configuration.")
	fs.StringVar(&o.proxy.BindAddress, "proxy-bind-address", ":8443", "Address the HTTPS proxy listens on.")
	fs.StringVar(&o.proxy.CertFile, "tls-cert-file", "", "Serving certificate of the proxy (PEM), reloaded when it changes. With --tls-private-key-file; a self-signed pair is generated when both are empty.")
	fs.StringVar(&o.proxy.KeyFile, "tls-private-key-file", "", "Private key of --tls-cert-file (PEM).")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", ":8080", "Address /metrics is served on; \"0\" disables it.")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true, "Serve /metrics over HTTPS to callers the API server authenticates (TokenReview) and authorizes for the non-resource URL /metrics, verb get (SubjectAccessReview). False: plain HTTP to anyone, for local runs. The probes are always plain HTTP.")
	fs.StringVar(&o.probeBindAddress, "health-probe-bind-address", ":8081", "Address /healthz and /readyz are served on.")
	fs.StringVar(&o.pprofBindAddress, "pprof-bind-address", "0", "Address Go's /debug/pprof/ profiles are served on (plain HTTP, no authentication), a loopback address only (127.0.0.1:6060, [::1]:6060, localhost:6060); \"0\" (default) disables it.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Elect a leader among replicas for the writes that need one (status pruning, conditions, the budgets' shares: see --share-budgets). The proxy and policy reload run on every replica.")
	fs.BoolVar(&o.shareBudgets, "share-budgets", true, "With --leader-elect, the replicas share each budget: the leader allocates each replica a fraction of every identity's limits from the demand the replicas report, through Leases in --leader-election-namespace, so that an identity spread over replicas gets its budget in all (docs/operators.md, \"Budgets with several replicas\"). False, or without --leader-elect: each replica enforces every budget in full.")
	fs.IntVar(&o.replicas, "replicas", 0, "Replicas expected, for the even split of the budgets a replica enforces before the leader's first allocation (with --share-budgets). 0: the replicas whose Leases it sees.")
	fs.StringVar(&o.leaderElectionNS, "leader-election-namespace", "", "Namespace of the leader-election Lease. Empty: the pod's namespace ($POD_NAMESPACE), or kube-system outside a cluster.")
	fs.StringVar(&o.podName, "pod-name", os.Getenv("POD_NAME"), "Name of this replica, the key of its entry in WatchBudget status and the replica the top endpoint names. Default $POD_NAME, else the host name.")
	fs.StringVar(&o.podNamespace, "pod-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of this replica. Default $POD_NAMESPACE.")
	fs.DurationVar(&o.upstreamTimeout, "upstream-check-timeout", 15*time.Second, "How long to wait for the API server at start-up before giving up (1s–5m).")
	fs.IntVar(&o.proxy.MaxHeaderBytes, "max-header-bytes", proxy.DefaultMaxHeaderBytes, "Largest request header block the proxy reads, in bytes (larger: 431). "+
		"Default 64 KiB: a service-account token is ~1 KiB, an OIDC token a few KiB, an agent impersonating a user in 200 groups ~15 KiB; "+
		"Go's and kube-apiserver's 1 MiB would let each slow connection pin 1 MiB (1,000 of them: over the chart's 512 Mi limit). 0: the default.")
	fs.StringVar((*string)(&o.proxy.ReviewFailurePolicy), "review-failure-policy", string(proxy.FailClosed), "What a request gets when its TokenReview or impersonation SubjectAccessReview fails or times out: "+
		"Closed (503 with Retry-After) or Open (forwarded; the API server still authenticates it; charged to a user of the token's own in the group system:watchgate:unreviewed, or to the caller for a failed impersonation check).")
	fs.DurationVar(&o.proxy.ReviewTimeout, "review-timeout", 10*time.Second, "Longest wait for one TokenReview or SubjectAccessReview. 0: the default.")
	fs.Float64Var(&o.proxy.TokenReviewsPerClientPerSecond, "token-reviews-per-client-per-second", 5, "TokenReviews per second each client network (IPv4 /24, IPv6 /64) may cause (its own bucket, before the shared --reviews limit). 0: the default.")
	fs.IntVar(&o.proxy.TokenReviewClientBurst, "token-review-client-burst", 20, "Burst of --token-reviews-per-client-per-second. 0: the default.")
	fs.Float64Var(&o.proxy.ImpersonationReviewsPerCallerPerSecond, "impersonation-reviews-per-caller-per-second", 20, "Impersonation SubjectAccessReviews per second each caller may cause; callers allowed an impersonation in the last 10 minutes use only this bucket. 0: the default.")
	fs.IntVar(&o.proxy.ImpersonationReviewCallerBurst, "impersonation-review-caller-burst", 200, "Burst of --impersonation-reviews-per-caller-per-second. 0: the default.")
	o.proxy.LocalServiceAccountTokens = new(bool)
	fs.BoolVar(o.proxy.LocalServiceAccountTokens, "local-service-account-tokens", true, "Verify the API server's service-account JWTs locally against its published keys (/openid/v1/jwks) instead of with a TokenReview. "+
		"Only whose budget a request spends depends on it: the API server authenticates every forwarded request itself.")
	fs.Func("service-account-audiences", "Comma-separated audiences a locally verified service-account token must name one of. Empty: the issuer (kube-apiserver's default --api-audiences). Other tokens are reviewed.", func(v string) error {
		o.proxy.ServiceAccountAudiences = splitList(v)
		return nil
	})
	fs.DurationVar(&o.proxy.ShutdownGracePeriod, "shutdown-grace-period", proxy.DefaultShutdownGracePeriod, "On shutdown, open watches are closed spread over this period so their clients do not reconnect all at once; at most 10m; 0: the default.")
	fs.IntVar(&o.webhookPort, "webhook-port", 0, "Port the pod injection webhook (HTTPS) listens on; 0 (default) disables injection and the CA publisher. Needs --tls-cert-file.")
	fs.StringVar(&o.webhookCertFile, "webhook-cert-file", "", "Serving certificate of the webhook (PEM), reloaded when it changes. Default --tls-cert-file.")
	fs.StringVar(&o.webhookKeyFile, "webhook-key-file", "", "Private key of --webhook-cert-file, in the same folder. Default --tls-private-key-file.")
	fs.StringVar(&o.caFile, "ca-file", "", "CA bundle (PEM) that signed the proxy's serving certificate, published to routed namespaces as ConfigMap watchgate-root-ca.crt and re-read every 10s. Default ca.crt beside --tls-cert-file (a kubernetes.io/tls Secret's layout).")
	fs.StringVar(&o.injectServiceHost, "inject-service-host", "", "KUBERNETES_SERVICE_HOST given to routed pods: the proxy Service's DNS name, which must be in its certificate. Default watchgate.$POD_NAMESPACE.svc.<--cluster-domain>.")
	fs.StringVar(&o.clusterDomain, "cluster-domain", "cluster.local", "The cluster's DNS domain, which completes the default --inject-service-host to a fully qualified name.")
	fs.IntVar(&o.injectServicePort, "inject-service-port", 443, "KUBERNETES_SERVICE_PORT given to routed pods: the proxy Service's port (1-65535).")
	o.memoryLimit = proxy.ProcessMemoryLimit()
	fs.IntVar(&o.proxy.MaxWatches, "max-watches", proxy.MaxWatchesFor(o.memoryLimit), "Watches this replica forwards at once, whatever the budgets say; beyond it new watches get 429 with Retry-After; 0: no cap. "+
		"The default is derived from the Go runtime's memory limit: (limit - 64 MiB) / 26 KiB, at least 100, "+
		"where the limit is GOMEMLIMIT, else 90% of the cgroup's memory limit, else 90% of 512 MiB (at most a quarter of physical memory); "+
		"watchgate sets the runtime's limit itself when GOMEMLIMIT is unset (GOMEMLIMIT=off: it sets none, and memory is not checked). About 33,000 watches per GiB of a container's memory limit.")
	fs.IntVar(&o.proxy.MaxWatchesPerIdentity, "max-watches-per-identity", 0, "Watches one caller (authenticated identity, whoever it impersonates) holds through this replica at once; beyond it its new watches get 429 with Retry-After. 0 (default): a quarter of --max-watches, so that one caller never fills a replica; at most --max-watches.")
	fs.Float64Var(&o.proxy.WatchOpensPerIdentityPerSecond, "watch-opens-per-identity-per-second", proxy.DefaultWatchOpensPerIdentityPerSecond, "Watches one caller (authenticated identity, whoever it impersonates) opens through this replica per second, on average, once it has opened --watch-open-burst-per-identity at once; beyond it its new watches get 429 with Retry-After. Watches answered without the API server are not counted. 0: no ceiling.")
	fs.IntVar(&o.proxy.WatchOpenBurstPerIdentity, "watch-open-burst-per-identity", proxy.DefaultWatchOpenBurstPerIdentity, "Watches one caller opens through this replica at once before --watch-opens-per-identity-per-second holds it back. 0: no ceiling.")
	fs.IntVar(&o.proxy.MaxWatchOpensInFlight, "max-watch-opens-in-flight", proxy.DefaultMaxWatchOpensInFlight, "Watch opens this replica has sent upstream and not had the response headers of (a watch asking for initial state: until that state has passed), at most (fewer while the API server answers them slowly, at least 16 or the flag); the others wait their turn, queued fairly between tenants (a namespace's service accounts together, any other caller alone) and the users behind an agent, at most 15 s, else 429 with Retry-After. 0: the default; negative: no bound.")
	fs.IntVar(&o.proxy.MaxConnections, "max-connections", proxy.DefaultMaxConnections, "Client connections the proxy holds open at once; beyond it new connections wait in the kernel's accept queue until one closes; connections on which nothing authenticated are shed first (and closed after 20 s); near the cap one client network (IPv4 /24, IPv6 /64) holds at most a quarter of them. Each open connection holds a goroutine, TLS state and buffers; 0: no cap.")
	fs.IntVar(&o.proxy.MemoryHighWaterPercent, "memory-high-water-percent", proxy.DefaultMemoryHighWaterPercent, "Refuse new watches with 503 and Retry-After while the Go runtime uses more than this percentage of its memory limit: GOMEMLIMIT, or the one watchgate sets without it (see --max-watches). 1–100; 100: never; 0: the default.")
	fs.DurationVar(&o.proxy.StalledStreamTimeout, "stalled-stream-timeout", proxy.DefaultStalledStreamTimeout, "Cut a forwarded watch or list whose client has taken none of a write (at most 32 KiB) for this long, freeing what it holds, as kube-apiserver's watch cache closes watchers that do not keep up. 1s–1h; 0: the default.")
	fs.IntVar(&o.proxy.MaxListsPerIdentity, "max-lists-per-identity", proxy.DefaultMaxListsPerIdentity, "Lists one tenant (an authenticated identity, whoever it impersonates; a namespace's service accounts together) has in flight through this replica at once; beyond it its new lists get 429 with Retry-After. At most 1000000; 0: the default.")
	fs.StringVar(&o.bootstrapBudgets, "bootstrap-budgets", "", "WatchBudgets the leader keeps in place, as a JSON list of {name, mandatory, labels, spec}: "+
		"a missing one is created (again after a deletion); a mandatory one's spec is restored after any edit; a suggested one's is kept up to date until an operator takes it over with the annotation "+controllers.AutoUpdateAnnotation+"=false. "+
		"A budget this install created (label "+controllers.BootstrapLabel+"=<--pod-namespace>) that is no longer listed and not taken over is deleted. The chart sets it; empty: none.")
	o.zap.BindFlags(fs)
}

// validate reports every bad flag at once, in a fixed order (never a
// map's): main's own flags, then the proxy's in the order of
// proxy.Options.Validate, each as "--flag: problem". The proxy's bounds
// are Validate's; main only names the flags.
func (o *options) validate() error {
	var errs field.ErrorList
	flagPath := func(name string) *field.Path { return field.NewPath("--" + name) }
	switch o.mode {
	case modeAll, modeProxy:
	case modeInjector:
		if o.webhookPort == 0 {
			errs = append(errs, field.Required(flagPath("webhook-port"), "--mode=injector needs it"))
		}
	default:
		errs = append(errs, field.NotSupported(flagPath("mode"), o.mode, []string{modeAll, modeProxy, modeInjector}))
	}
	if o.mode == modeProxy && o.webhookPort != 0 {
		errs = append(errs, field.Forbidden(flagPath("webhook-port"), "needs --mode=all or --mode=injector"))
	}
	errs = append(errs, bounds.NonNegative(flagPath("replicas"), o.replicas)...)
	if _, _, err := net.SplitHostPort(o.probeBindAddress); err != nil {
		errs = append(errs, field.Invalid(flagPath("health-probe-bind-address"), o.probeBindAddress, err.Error()))
	}
	for _, f := range []struct{ name, addr string }{
		{"metrics-bind-address", o.metricsBindAddress},
		{"pprof-bind-address", o.pprofBindAddress},
	} {
		if f.addr == "0" {
			continue
		}
		if _, _, err := net.SplitHostPort(f.addr); err != nil {
			errs = append(errs, field.Invalid(flagPath(f.name), f.addr, err.Error()))
		}
	}
	if o.pprofBindAddress != "0" && !isLoopback(o.pprofBindAddress) {
		errs = append(errs, field.Invalid(flagPath("pprof-bind-address"), o.pprofBindAddress, "must be a loopback address (profiles are served without authentication)"))
	}
	errs = append(errs, bounds.Within(flagPath("upstream-check-timeout"), o.upstreamTimeout, time.Second, 5*time.Minute)...)
	errs = append(errs, bounds.Within(flagPath("webhook-port"), o.webhookPort, 0, 65535)...)
	if o.webhookPort > 0 && o.proxy.CertFile == "" {
		errs = append(errs, field.Required(flagPath("tls-cert-file"), "--webhook-port needs it: routed pods must trust the proxy's certificate, and a generated one names no Service"))
	}
	switch {
	case o.webhookCertFile != "" && o.webhookKeyFile == "":
		errs = append(errs, field.Required(flagPath("webhook-key-file"), "with --webhook-cert-file"))
	case o.webhookCertFile == "" && o.webhookKeyFile != "":
		errs = append(errs, field.Required(flagPath("webhook-cert-file"), "with --webhook-key-file"))
	}
	errs = append(errs, bounds.Within(flagPath("inject-service-port"), o.injectServicePort, 1, 65535)...)
	var err error
	if o.bootstrap, err = controllers.ParseBootstrapBudgets(o.bootstrapBudgets); err != nil {
		errs = append(errs, field.Invalid(flagPath("bootstrap-budgets"), field.OmitValueType{}, err.Error()))
	}
	for _, e := range o.proxy.Validate() {
		if name, ok := proxyFlags[e.Field]; ok {
			e.Field = flagPath(name).String()
		}
		errs = append(errs, e)
	}
	return errs.ToAggregate()
}

// complete fills in defaults that depend on the environment.
func (o *options) complete() error {
	if o.podName == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--pod-name is empty and the host name is unknown: %w", err)
		}
		o.podName = h
	}
	if o.leaderElectionNS == "" {
		o.leaderElectionNS = o.podNamespace
	}
	if o.webhookPort > 0 {
		if o.webhookCertFile == "" {
			o.webhookCertFile, o.webhookKeyFile = o.proxy.CertFile, o.proxy.KeyFile
		}
		if o.caFile == "" {
			o.caFile = filepath.Join(filepath.Dir(o.proxy.CertFile), "ca.crt")
		}
		if o.injectServiceHost == "" {
			if o.podNamespace == "" {
				return errors.New("--inject-service-host is empty and so is --pod-namespace")
			}
			o.injectServiceHost = "watchgate." + o.podNamespace + ".svc." + o.clusterDomain
		}
	}
	if o.leaderElectionNS == "" {
		o.leaderElectionNS = "kube-system"
	}
	return nil
}

// isLoopback reports whether addr (host:port) names a loopback address:
// "localhost" or a loopback IP; an empty host means every interface.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// metricsOptions serves /metrics, behind the API server's authentication
// and authorization unless --metrics-secure=false (the serving
// certificate is generated: scrapers verify the caller, not the server).
func (o *options) metricsOptions() metricsserver.Options {
	m := metricsserver.Options{BindAddress: o.metricsBindAddress}
	if o.metricsSecure {
		m.SecureServing = true
		m.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return m
}

// restConfig loads --kubeconfig, or the in-cluster configuration when empty.
func (o *options) restConfig() (*rest.Config, error) {
	if o.kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not in a cluster: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load --kubeconfig %s: %w", o.kubeconfig, err)
	}
	return cfg, nil
}

// checkUpstream fails fast, with one line, when the API server cannot be
// reached or does not accept watchgate's own credentials.
func checkUpstream(ctx context.Context, cfg *rest.Config, timeout time.Duration) error {
	c := rest.CopyConfig(cfg)
	c.Timeout = timeout
	dc, err := discovery.NewDiscoveryClientForConfig(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := dc.RESTClient().Get().AbsPath("/version").Do(ctx).Raw(); err != nil {
		return fmt.Errorf("API server %s unreachable: %w", cfg.Host, err)
	}
	return nil
}

// leaderElectionID is the Lease of this mode's leader: the injector
// Deployment elects its CA publisher apart from the proxy's status
// writers.
func (o *options) leaderElectionID() string {
	if o.mode == modeInjector {
		return "watchgate-injector.watchgate.io"
	}
	return "watchgate.watchgate.io"
}

// runInjector is --mode=injector: the webhook and the CA publisher, ready
// once the webhook serves.
func runInjector(ctx context.Context, mgr ctrl.Manager, o *options) error {
	srv, err := setupInjection(mgr, o)
	if err != nil {
		return fmt.Errorf("set up injection: %w", err)
	}
	if err := mgr.AddReadyzCheck("webhook", srv.StartedChecker()); err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("Starting watchgate injector", "version", version, "webhookPort", o.webhookPort, "pod", o.podName)
	return mgr.Start(ctx)
}

// setupInjection adds the pod injection webhook and the CA publisher.
func setupInjection(mgr ctrl.Manager, o *options) (webhook.Server, error) {
	excluded := []string{"kube-system"}
	var own []string // watchgate's namespace, for kubectl watchgate top
	if o.podNamespace != "" {
		own = []string{o.podNamespace}
		excluded = append(excluded, own...)
	}
	srv := webhook.NewServer(webhook.Options{
		Port:     o.webhookPort,
		CertDir:  filepath.Dir(o.webhookCertFile),
		CertName: filepath.Base(o.webhookCertFile),
		KeyName:  filepath.Base(o.webhookKeyFile),
	})
	_, err := inject.SetupWithManager(mgr, inject.Options{
		Target:             inject.Target{Host: o.injectServiceHost, Port: int32(o.injectServicePort)},
		ExcludedNamespaces: excluded,
		PublishTo:          own,
		CA:                 &inject.CASource{File: o.caFile},
		WebhookServer:      srv,
	})
	return srv, err
}

// newScheme is the one scheme of the manager: the built-in types and the
// WatchBudget types the controllers need.
func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(watchgatev1alpha1.AddToScheme(s))
	return s
}

func main() {
	if err := run(ctrl.SetupSignalHandler(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "watchgate:", err)
		os.Exit(1)
	}
}

// run is watchgate until ctx is cancelled; it returns nil after a clean
// shutdown and a one-line error otherwise.
func run(ctx context.Context, args []string) error {
	var o options
	fs := flag.NewFlagSet("watchgate", flag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	if err := o.complete(); err != nil {
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	log := ctrl.Log.WithName("setup")
	// The memory guard and the derived watch cap count against the Go
	// runtime's limit: without GOMEMLIMIT, set it from the cgroup's limit
	// or the fallback (proxy.ProcessMemoryLimit), so that a process
	// without either is still held to a budget. GOMEMLIMIT=off opts out.
	if o.memoryLimit.SetsRuntimeLimit() {
		debug.SetMemoryLimit(int64(o.memoryLimit.GoMemLimit))
	}

	cfg, err := o.restConfig()
	if err != nil {
		return err
	}
	if err := checkUpstream(ctx, cfg, o.upstreamTimeout); err != nil {
		return err
	}

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  newScheme(),
		Metrics:                 o.metricsOptions(),
		HealthProbeBindAddress:  o.probeBindAddress,
		PprofBindAddress:        o.pprofBindAddress,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        o.leaderElectionID(),
		LeaderElectionNamespace: o.leaderElectionNS,
		// The proxy drains its watches itself; see proxy.DefaultShutdownGracePeriod.
		GracefulShutdownTimeout: ptr.To(o.proxy.GracefulShutdownTimeout()),
		// One manager per process; run may still be called again in the
		// same process (tests), and controller names are fixed.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if o.mode == modeInjector {
		return runInjector(ctx, mgr, &o)
	}

	events := controllers.NewThrottleEvents(mgr, nil)
	engine := ratelimit.NewEngine(ratelimit.Options{OnThrottled: events.OnThrottled})
	var shares *controllers.ShareOptions
	if o.leaderElect && o.shareBudgets {
		shares = &controllers.ShareOptions{Namespace: o.leaderElectionNS, Replicas: o.replicas}
	}
	if _, err := controllers.SetupWithManager(mgr, engine, controllers.Options{
		PodName:        o.podName,
		Namespace:      o.podNamespace,
		Bootstrap:      o.bootstrap,
		ThrottleEvents: events,
		Shares:         shares,
	}); err != nil {
		return fmt.Errorf("set up controllers: %w", err)
	}
	po := o.proxy
	po.Upstream, po.Engine, po.Logger, po.ReplicaName = cfg, engine, ctrl.Log.WithName("proxy"), o.podName
	srv, err := proxy.NewServer(po)
	if err != nil {
		return fmt.Errorf("set up proxy: %w", err)
	}
	if err := mgr.Add(srv); err != nil {
		return err
	}
	if err := mgr.Add(StackBallast{}); err != nil {
		return err
	}
	if o.webhookPort > 0 {
		if _, err := setupInjection(mgr, &o); err != nil {
			return fmt.Errorf("set up injection: %w", err)
		}
	}
	if err := mgr.AddReadyzCheck("upstream", srv.ReadyCheck); err != nil {
		return err
	}

	log.Info("Starting watchgate", "version", version, "proxy", o.proxy.BindAddress, "upstream", cfg.Host, "pod", o.podName)
	l := o.memoryLimit
	log.Info("Memory limit", "source", l.Source, "limitBytes", l.Bytes, "goMemLimitBytes", l.GoMemLimit,
		"physicalMemoryBytes", l.PhysicalBytes, "why", l.Why(), "memoryHighWaterPercent", cmp.Or(o.proxy.MemoryHighWaterPercent, proxy.DefaultMemoryHighWaterPercent))
	capFrom := "--max-watches"
	if !flagSet(fs, "max-watches") {
		capFrom = l.Source
	}
	log.Info("Watch cap", "maxWatches", o.proxy.MaxWatches, "maxWatchesPerIdentity", cmp.Or(o.proxy.MaxWatchesPerIdentity, proxy.DefaultMaxWatchesPerIdentity(o.proxy.MaxWatches)),
		"from", capFrom, "goMemLimitBytes", l.GoMemLimit)
	return mgr.Start(ctx)
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
