// Command watchgate keeps Kubernetes API servers alive through watch storms.
//
// It is one binary: a controller-runtime manager that compiles WatchBudgets
// into the rate-limit engine's policy and writes their status, and an HTTPS
// proxy in front of kube-apiserver that admits or rejects every watch like an
// admission step. Clients change nothing but the server URL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	watchgatev1alpha1 "github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// version is stamped at build time (-ldflags "-X main.version=...").
var version = "dev"

// options are watchgate's command-line flags: Options → Validate → Complete
// → Run, as kube-rbac-proxy does.
type options struct {
	kubeconfig         string
	proxyBindAddress   string
	tlsCertFile        string
	tlsPrivateKeyFile  string
	metricsBindAddress string
	probeBindAddress   string
	leaderElect        bool
	leaderElectionNS   string
	podName            string
	podNamespace       string
	upstreamTimeout    time.Duration
	shutdownGrace      time.Duration
	maxWatches         int
	memoryHighWater    int

	zap zap.Options
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig for the upstream API server and watchgate's own client. Empty: in-cluster configuration.")
	fs.StringVar(&o.proxyBindAddress, "proxy-bind-address", ":8443", "Address the HTTPS proxy listens on.")
	fs.StringVar(&o.tlsCertFile, "tls-cert-file", "", "Serving certificate of the proxy (PEM), reloaded when it changes. With --tls-private-key-file; a self-signed pair is generated when both are empty.")
	fs.StringVar(&o.tlsPrivateKeyFile, "tls-private-key-file", "", "Private key of --tls-cert-file (PEM).")
	fs.StringVar(&o.metricsBindAddress, "metrics-bind-address", ":8080", "Address /metrics is served on (plain HTTP); \"0\" disables it.")
	fs.StringVar(&o.probeBindAddress, "health-probe-bind-address", ":8081", "Address /healthz and /readyz are served on.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Elect a leader among replicas for the writes that need one (status pruning, conditions). The proxy and policy reload run on every replica.")
	fs.StringVar(&o.leaderElectionNS, "leader-election-namespace", "", "Namespace of the leader-election Lease. Empty: the pod's namespace ($POD_NAMESPACE), or kube-system outside a cluster.")
	fs.StringVar(&o.podName, "pod-name", os.Getenv("POD_NAME"), "Name of this replica, the key of its entry in WatchBudget status. Default $POD_NAME, else the host name.")
	fs.StringVar(&o.podNamespace, "pod-namespace", os.Getenv("POD_NAMESPACE"), "Namespace of this replica. Default $POD_NAMESPACE.")
	fs.DurationVar(&o.upstreamTimeout, "upstream-check-timeout", 15*time.Second, "How long to wait for the API server at start-up before giving up (1s–5m).")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace-period", 30*time.Second, "On shutdown, open watches are closed spread over this period so their clients do not reconnect all at once (0–10m).")
	fs.IntVar(&o.maxWatches, "max-watches", proxy.DefaultMaxWatches, "Watches this replica forwards at once, whatever the budgets say; beyond it new watches get 429 with Retry-After. The default fits the chart's 512Mi memory limit (BENCHMARKS.md, load); 0: no cap.")
	fs.IntVar(&o.memoryHighWater, "memory-high-water-percent", proxy.DefaultMemoryHighWaterPercent, "Refuse new watches with 503 and Retry-After while the Go runtime uses more than this percentage of GOMEMLIMIT (1–100; 100: never). Without GOMEMLIMIT memory is not checked.")
	o.zap.BindFlags(fs)
}

// validate reports every bad flag at once.
func (o *options) validate() error {
	var errs []error
	if (o.tlsCertFile == "") != (o.tlsPrivateKeyFile == "") {
		errs = append(errs, errors.New("--tls-cert-file and --tls-private-key-file must be set together"))
	}
	for name, addr := range map[string]string{"--proxy-bind-address": o.proxyBindAddress, "--health-probe-bind-address": o.probeBindAddress} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", name, addr, err))
		}
	}
	if o.metricsBindAddress != "0" {
		if _, _, err := net.SplitHostPort(o.metricsBindAddress); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-bind-address %q: %w", o.metricsBindAddress, err))
		}
	}
	if o.upstreamTimeout < time.Second || o.upstreamTimeout > 5*time.Minute {
		errs = append(errs, fmt.Errorf("--upstream-check-timeout %s: must be between 1s and 5m", o.upstreamTimeout))
	}
	if o.shutdownGrace < 0 || o.shutdownGrace > 10*time.Minute {
		errs = append(errs, fmt.Errorf("--shutdown-grace-period %s: must be between 0 and 10m", o.shutdownGrace))
	}
	if o.maxWatches < 0 {
		errs = append(errs, fmt.Errorf("--max-watches %d: must not be negative", o.maxWatches))
	}
	if o.memoryHighWater < 1 || o.memoryHighWater > 100 {
		errs = append(errs, fmt.Errorf("--memory-high-water-percent %d: must be between 1 and 100", o.memoryHighWater))
	}
	return utilerrors.NewAggregate(errs)
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
	if o.leaderElectionNS == "" {
		o.leaderElectionNS = "kube-system"
	}
	return nil
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

	cfg, err := o.restConfig()
	if err != nil {
		return err
	}
	if err := checkUpstream(ctx, cfg, o.upstreamTimeout); err != nil {
		return err
	}

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  newScheme(),
		Metrics:                 metricsserver.Options{BindAddress: o.metricsBindAddress},
		HealthProbeBindAddress:  o.probeBindAddress,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "watchgate.watchgate.io",
		LeaderElectionNamespace: o.leaderElectionNS,
		// The proxy drains its watches itself (drain delay, then the grace
		// period); give it room.
		GracefulShutdownTimeout: ptr.To(o.shutdownGrace + 15*time.Second),
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

	events := controllers.NewThrottleEvents()
	engine := ratelimit.NewEngine(ratelimit.Options{OnThrottled: events.OnThrottled})
	if _, err := controllers.SetupWithManager(mgr, engine, controllers.Options{
		PodName:        o.podName,
		Namespace:      o.podNamespace,
		ThrottleEvents: events,
	}); err != nil {
		return fmt.Errorf("set up controllers: %w", err)
	}
	srv, err := proxy.NewServer(proxy.Options{
		BindAddress:         o.proxyBindAddress,
		CertFile:            o.tlsCertFile,
		KeyFile:             o.tlsPrivateKeyFile,
		Upstream:            cfg,
		Engine:              engine,
		Logger:              ctrl.Log.WithName("proxy"),
		ShutdownGracePeriod: o.shutdownGrace,

		MaxWatches:             o.maxWatches,
		MemoryHighWaterPercent: o.memoryHighWater,
	})
	if err != nil {
		return fmt.Errorf("set up proxy: %w", err)
	}
	if err := mgr.Add(srv); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("upstream", srv.ReadyCheck); err != nil {
		return err
	}

	log.Info("Starting watchgate", "version", version, "proxy", o.proxyBindAddress, "upstream", cfg.Host, "pod", o.podName)
	return mgr.Start(ctx)
}
