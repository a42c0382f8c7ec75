package admit

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/ratelimit"
)

// rebuildsTotal counts rebuilds: what a client sends to fill its cache of
// one resource from scratch (ratelimit's rebuild: a LIST's first page, or
// a watch that asks for initial state), once the API server has answered
// it 200. Only answered requests count, so its series are the resources
// the API server serves, however many names clients make up.
var rebuildsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "watchgate_proxy_rebuilds_total",
	Help: "Rebuilds of a client's cache of one resource that the API server answered 200 (a LIST's first page, or a watch that asks for initial state such as a watch-list), by group and resource: one series per resource served, no user. 60*rate() is rebuilds per minute.",
}, []string{"group", "resource"})

func init() { metrics.Registry.MustRegister(rebuildsTotal) }

// forwardCountingRebuilds forwards an admitted list (or anything else the admission
// filter passes on) and counts a LIST's first page the API server answered
// 200 as a rebuild of its resource.
func forwardCountingRebuilds(w http.ResponseWriter, r *http.Request, c *request.Classification, next http.Handler) {
	if c.Verb != ratelimit.VerbList || c.Continue {
		next.ServeHTTP(w, r)
		return
	}
	sw := &statusRecorder{ResponseWriter: w}
	next.ServeHTTP(sw, r)
	if sw.status == http.StatusOK {
		rebuildsTotal.WithLabelValues(c.APIGroup, c.Resource).Inc()
	}
}

// countWatchRebuild counts a watch the API server answered 200 as a
// rebuild when it asked for initial state: sendInitialEvents=true, or no
// sendInitialEvents and a version "" or "0".
func countWatchRebuild(c *request.Classification) {
	initial := c.ResourceVersion == "" || c.ResourceVersion == "0"
	if c.SendInitialEvents != nil {
		initial = *c.SendInitialEvents
	}
	if initial {
		rebuildsTotal.WithLabelValues(c.APIGroup, c.Resource).Inc()
	}
}

// statusRecorder remembers the first final status written through it.
// Unwrap lets http.ResponseController (the reverse proxy's flushes) reach
// the writer beneath.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= http.StatusOK {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
