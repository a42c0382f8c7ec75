package proxy

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var logsSuppressed = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "watchgate_proxy_logs_suppressed_total",
	Help: "Decision and error log lines dropped by the proxy's log rate limit.",
})

func init() { metrics.Registry.MustRegister(logsSuppressed) }

// sampledLogger logs at most a few lines per second, so that a storm of
// requests does not become a storm of logs. Lines dropped in between are
// counted (watchgate_proxy_logs_suppressed_total) and the next line that
// gets through says how many were dropped. Filters log here because a
// handler has no caller to return an error to.
type sampledLogger struct {
	log        logr.Logger
	limiter    *rate.Limiter
	suppressed atomic.Int64
}

// newSampledLogger lets perSecond lines through per second, burst at once.
func newSampledLogger(log logr.Logger, perSecond float64, burst int) *sampledLogger {
	return &sampledLogger{log: log, limiter: rate.NewLimiter(rate.Limit(perSecond), burst)}
}

// Info logs msg unless the rate is spent.
func (s *sampledLogger) Info(msg string, keysAndValues ...any) {
	if !s.limiter.Allow() {
		s.suppressed.Add(1)
		logsSuppressed.Inc()
		return
	}
	if n := s.suppressed.Swap(0); n > 0 {
		keysAndValues = append(keysAndValues, "suppressedSinceLast", n)
	}
	s.log.Info(msg, keysAndValues...)
}

// maxLoggedValueBytes bounds a caller-chosen string in a log line.
const maxLoggedValueBytes = 256

// boundedForLog returns s, cut to maxLoggedValueBytes with the number of
// bytes left out, so that a caller cannot make a log line as large as its
// request.
func boundedForLog(s string) string {
	if len(s) <= maxLoggedValueBytes {
		return s
	}
	return fmt.Sprintf("%s…(%d more bytes)", strings.ToValidUTF8(s[:maxLoggedValueBytes], ""), len(s)-maxLoggedValueBytes)
}

// logWriter turns the standard library's log lines (http.Server,
// ReverseProxy) into sampled logr lines.
type logWriter struct{ logs *sampledLogger }

func (l logWriter) Write(p []byte) (int, error) {
	l.logs.Info("HTTP", "message", strings.TrimSpace(string(p)))
	return len(p), nil
}
