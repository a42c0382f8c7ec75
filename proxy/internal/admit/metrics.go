package admit

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics live on controller-runtime's registry, served at /metrics on the
// manager's metrics address. No label ever holds a user name: budgets are
// few (one per WatchBudget), reasons and verbs are enums.
var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_requests_total",
		Help: "Requests through the proxy by verb (watch, list, other), decision (allow, reject, dryrun-reject), " +
			"reason (engine reason, empty when allowed), budget (WatchBudget name, empty when none governs) and enforcement.",
	}, []string{"verb", "decision", "reason", "budget", "enforcement"})

	activeWatches = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_active_watches",
		Help: "Watches currently forwarded to the API server through this replica.",
	})

	upstreamWatchOpens = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "watchgate_proxy_upstream_watch_opens_total",
		Help: "Watch requests forwarded to the API server.",
	})

	watchOpenSeatsLimit = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_watch_open_seats",
		Help: "Watch opens this replica lets be in flight upstream now: --max-watch-opens-in-flight, halved while the API server answers opens slowly and grown back by one per round.",
	})

	decisionSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "watchgate_proxy_decision_duration_seconds",
		Help:    "Time the engine took to decide a watch or list, by verb (watch, list).",
		Buckets: []float64{1e-6, 5e-6, 25e-6, 1e-4, 5e-4, 2.5e-3, 1e-2, 5e-2},
	}, []string{"verb"})
)

func init() {
	metrics.Registry.MustRegister(requestsTotal, activeWatches, upstreamWatchOpens,
		watchOpenSeatsLimit, decisionSeconds)
}
