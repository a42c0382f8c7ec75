package upstream

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/ratelimit"
)

// upstreamThrottled counts the API server's own 429s, which the forwarder
// passes through untouched (status, Retry-After, body): kube-apiserver's
// flow control (APF, --max-requests-inflight) and, since 1.37, a
// consistent list its watch cache cannot serve in time
// (ConsistentListFromCacheSkipTimeoutFallback). Watchgate's own refusals
// are counted by watchgate_proxy_requests_total and
// watchgate_proxy_guard_rejections_total, never here.
var upstreamThrottled = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "watchgate_proxy_upstream_throttled_total",
	Help: "Requests the API server itself answered 429 Too Many Requests, passed through to the client, by verb (watch, list, other).",
}, []string{"verb"})

func init() { metrics.Registry.MustRegister(upstreamThrottled) }

// countThrottled counts resp when the API server answered 429.
func countThrottled(resp *http.Response) {
	if resp.StatusCode != http.StatusTooManyRequests {
		return
	}
	verb := "other"
	if c, ok := request.ClassificationFrom(resp.Request.Context()); ok {
		switch c.Verb {
		case ratelimit.VerbWatch:
			verb = "watch"
		case ratelimit.VerbList:
			verb = "list"
		}
	}
	upstreamThrottled.WithLabelValues(verb).Inc()
}
