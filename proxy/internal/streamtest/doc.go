// Package streamtest builds watch streams for tests as kube-apiserver
// writes them (JSON lines, length-prefixed protobuf, gzip members per
// flush) and reads them with apimachinery's own framer and decoder, the
// oracle the proxy's stream inspection is checked against.
//
// Only tests import it: proxy/internal/inspect's, and proxy's tests that
// relay watches end to end.
package streamtest
