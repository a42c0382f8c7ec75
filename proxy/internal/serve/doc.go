// Package serve is how proxy's Server listens: the serving Certificate
// (files reloaded when they change, or a generated self-signed pair),
// LimitConnections (a cap on open client connections that sheds those on
// which nothing authenticated first, and a share of it per client network
// near the cap), and HTTP2, which serves HTTP/2 with
// golang.org/x/net/http2 so that the chain's first filter runs directly
// under the server's frames (see proxy/internal/relay's WithRelayAtTop).
//
// It knows nothing of requests beyond their connections. proxy's Server
// uses it in Start.
package serve
