package relay

import "net/http"

// watchHeaders sends an admitted watch's 200 response headers to the
// client as soon as the reverse proxy writes them, from the handler's
// goroutine. Left alone, ReverseProxy sends them from a zero-delay
// timer's goroutine (its maxLatencyWriter), which a watch open then waits
// to be started and scheduled; everything else is the wrapped writer's,
// reached through Unwrap (http.ResponseController: Flush, Hijack for
// upgrades, deadlines).
type watchHeaders struct{ http.ResponseWriter }

func (w watchHeaders) WriteHeader(code int) {
	w.ResponseWriter.WriteHeader(code)
	if code == http.StatusOK {
		// An error means the client is gone; the stream's first write
		// finds out too.
		_ = http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w watchHeaders) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// NewWatchHeaders wraps w so that a watch's 200 headers are sent at once.
func NewWatchHeaders(w http.ResponseWriter) http.ResponseWriter { return watchHeaders{w} }
