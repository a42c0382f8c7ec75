package sampledlog

import (
	"fmt"
	"log"
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

// Logger logs at most a few lines per second, so that a storm of
// requests does not become a storm of logs. Lines dropped in between are
// counted (watchgate_proxy_logs_suppressed_total) and the next line that
// gets through says how many were dropped. Filters log here because a
// handler has no caller to return an error to.
type Logger struct {
	log        logr.Logger
	limiter    *rate.Limiter
	Suppressed atomic.Int64
}

// New lets perSecond lines through per second, burst at once.
func New(log logr.Logger, perSecond float64, burst int) *Logger {
	return &Logger{log: log, limiter: rate.NewLimiter(rate.Limit(perSecond), burst)}
}

// Info logs msg unless the rate is spent.
func (s *Logger) Info(msg string, keysAndValues ...any) {
	if !s.limiter.Allow() {
		s.Suppressed.Add(1)
		logsSuppressed.Inc()
		return
	}
	if n := s.Suppressed.Swap(0); n > 0 {
		keysAndValues = append(keysAndValues, "suppressedSinceLast", n)
	}
	s.log.Info(msg, keysAndValues...)
}

// MaxValueBytes bounds a caller-chosen string in a log line.
const MaxValueBytes = 256

// Bounded returns s, cut to MaxValueBytes with the number of
// bytes left out, so that a caller cannot make a log line as large as its
// request.
func Bounded(s string) string {
	if len(s) <= MaxValueBytes {
		return s
	}
	return fmt.Sprintf("%s…(%d more bytes)", strings.ToValidUTF8(s[:MaxValueBytes], ""), len(s)-MaxValueBytes)
}

// StdLogger is a standard library logger (for http.Server's and
// ReverseProxy's ErrorLog) whose lines go to s.
func (s *Logger) StdLogger() *log.Logger { return log.New(writer{s}, "", 0) }

// writer turns the standard library's log lines into sampled logr lines.
type writer struct{ logs *Logger }

func (l writer) Write(p []byte) (int, error) {
	l.logs.Info("HTTP", "message", strings.TrimSpace(string(p)))
	return len(p), nil
}
