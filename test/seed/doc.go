// Package seed reproduces, against a real kube-apiserver and etcd, the
// incident watchgate exists for (shared/seeds/000_*): a client re-subscribes
// with an item's resourceVersion instead of the list's, the API server
// answers "too old" inside an HTTP 200 stream, the client re-subscribes at
// once, forever — and every attempt reaches the API server. Its tests pin
// the upstream behaviour the proxy relies on; if they fail, the proxy's
// assumptions about the wire are out of date.
package seed
