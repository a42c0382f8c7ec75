package serve

import (
	"context"
	"crypto/tls"
	"net/http"

	"golang.org/x/net/http2"
)

// HTTP2 makes srv serve HTTP/2 with golang.org/x/net/http2, calling
// handler directly for every stream, with srv's settings and graceful
// shutdown (GOAWAY on srv.Shutdown).
//
// net/http's own HTTP/2 server calls the handler through two wrappers of
// its own (initALPNRequest and serverHandler), 480 bytes of stack above
// it for the life of every request: for an idle watch, enough to keep its
// goroutine's stack at 8 KiB instead of 4 (relay.WithRelayAtTop). What those
// wrappers add, x/net's server does itself for a TLS connection: the
// request's TLS state, its remote address and a body, and the server
// and local address in the request's context; the connection's base
// context (http.Server.ConnContext) comes from the wrapper net/http
// hands to TLSNextProto, as in http2.ConfigureServer.
//
// Frames are scheduled by x/net's random write scheduler, not by its
// default (and net/http's) round robin. The round robin keeps every open
// stream in a ring and looks at each, idle or not, whenever it looks for a
// frame to write: for an event, when the handler writes it and again after
// the frame is written (and for each frame the client sends). On a
// connection of 500 idle watches that is at least 1,000 looks per event,
// at a cache miss each once a replica holds tens of thousands of watches:
// most of the CPU an event cost at 50,000 watches. The random scheduler
// keeps only the streams that have frames queued. Watches ask for no
// priority.
func HTTP2(srv *http.Server, handler http.Handler) error {
	// x/net's server, for its random write scheduler: net/http has no way
	// to choose one. Its other settings come from srv.HTTP2.
	h2 := &http2.Server{NewWriteScheduler: http2.NewRandomWriteScheduler} //nolint:staticcheck // net/http's round robin cost most of the CPU at tens of thousands of watches

	if err := http2.ConfigureServer(srv, h2); err != nil { //nolint:staticcheck // x/net's server, not net/http's, so that the random write scheduler above is used
		return err
	}
	srv.TLSNextProto[http2.NextProtoTLS] = func(hs *http.Server, c *tls.Conn, h http.Handler) {
		var ctx context.Context
		if bc, ok := h.(interface{ BaseContext() context.Context }); ok {
			ctx = bc.BaseContext()
		}
		h2.ServeConn(c, &http2.ServeConnOpts{Context: ctx, Handler: handler, BaseConfig: hs}) //nolint:staticcheck // x/net's server serves the connection, with the random write scheduler net/http cannot be given
	}
	return nil
}
