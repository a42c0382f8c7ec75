// Package answer writes the answers the proxy gives itself, as
// kube-apiserver would: Status bodies in the negotiated media type (with
// Retry-After when the Status carries retryAfterSeconds), the
// X-Watchgate-Decision header, and the local answer to a watch from a
// stale resourceVersion (200, one ERROR 410 event in the client's framing).
// MetaCodecs is the scheme of the meta types (Status, WatchEvent) the proxy
// reads and writes.
//
// It decides nothing: the filters in proxy/internal/... choose what to
// answer and call it. Every filter that answers a request itself uses it.
package answer
