// Package upstream is how the proxy reaches the API server: the reverse
// proxy (NewReverseProxy: Rewrite, flushed per write, the caller's
// credentials passed through untouched, Status answers when the API server
// is unreachable) and its transport (NewTransport), which trusts the API
// server's CA and carries none of the proxy's own credentials.
//
// The transport sends upgrades over HTTP/1.1, everything else over shared
// HTTP/2 connections (upstreampool.go: another connection when the API
// server's stream limit per connection is reached, one dial at a time),
// and admitted watches over watchgate's own minimal HTTP/2 client
// (watchclient.go, watchconn.go, watchconnstream.go: no goroutine, timer
// or buffer per idle watch; flow-control windows sized so that a slow
// client stalls nobody else). A new upstream setting (a timeout, a window,
// a dial rule) is made here.
//
// It decides nothing about a request: an admitted watch is whatever the
// WatchLookup it is given says, and it tells that watch what the API server
// answered (AdmittedWatch). proxy's NewServer builds it; the relay reuses
// its copy buffers (CopyBuffers).
package upstream
