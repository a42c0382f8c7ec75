package relay

import (
	"net/http"

	"github.com/watchgate/watchgate/proxy/internal/request"
)

// WithRelayAtTop is the chain's first filter. It grows the handler
// goroutine's stack once, while it is shallow (growStack), and relays an
// admitted watch's stream from here, after every filter below it has
// returned, instead of from inside the admission filter.
//
// An idle watch's handler goroutine spends its life waiting for the
// stream's next byte, and the runtime keeps the stack it waits on: at
// each garbage collection it halves a goroutine's stack only while less
// than a quarter of it is in use, counting the runtime's 800-byte guard.
// Waiting below the filters (authentication, classification, identity,
// admission, the reverse proxy: about 3.6 KiB of frames) keeps 8 KiB per
// watch; waiting here, under only the HTTP/2 server's frames and the
// relay's, stays under the 1,248 bytes that let the stack shrink to
// 4 KiB: 4 KiB less for every idle watch, of about 20 KiB. The relay's
// frames are kept lean for it: the wait is copyWatch →
// watchBody.waitByte → the upstream body's read.
//
// The HTTP/2 server must call this filter directly (server.go serves
// HTTP/2 with golang.org/x/net/http2 for that reason: net/http's own
// HTTP/2 server adds two frames of its own, 480 bytes, above the handler).
// A handler chain without this filter relays inside the admission
// filter.
func WithRelayAtTop(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		growStack()
		st, r := request.StateOf(r)
		st.RelayAtTop = true
		defer func() {
			// A filter panicked after admitting the watch: its end still
			// runs (its slot, its place in the guard, its followers).
			if relay := st.Relay; relay != nil {
				st.Relay = nil
				relay(false)
			}
		}()
		next.ServeHTTP(w, r)
		if relay := st.Relay; relay != nil {
			st.Relay = nil
			relay(true)
		}
	})
}
