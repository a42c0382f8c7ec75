// Package upstreamtest starts API-server stand-ins for tests: TLS HTTP/2
// servers with kube-apiserver's stream limit per connection that hold
// watches open, the rest.Config that trusts them, and a way to open many
// watches at once.
//
// Only tests import it: proxy/internal/upstream's, and proxy's
// end-to-end and benchmark tests.
package upstreamtest
