// Package proxy is watchgate's data path: an HTTPS reverse proxy that stands
// in front of kube-apiserver and admits watches (and budgeted lists) through
// the ratelimit engine. Clients change nothing but the server URL.
//
// A request goes through a chain of filters, each shaped
// func(deps…, next http.Handler) http.Handler and built once by NewServer:
//
//	withRelayAtTop      grows the handler goroutine's stack to 8 KiB once, while it is shallow
//	                    (stack.go); relays an admitted watch's stream once the filters below
//	                    have returned, so that an idle watch waits on a 4 KiB stack (relayattop.go)
//	withAuthentication  bearer token, read as kube-apiserver reads it (headers.go; 400 where the two
//	                    could differ) → service-account JWTs verified locally against the API
//	                    server's published keys (serviceaccount_tokens.go) and their service
//	                    account, pod or node (boundobjects.go), every other token by TokenReview
//	                    (reviewcache.go: cached, fair per client network, a lane for tokens valid
//	                    recently, bounded); 401 without forwarding
//	withTop             every path under /.watchgate/ (which kube-apiserver never serves) is
//	                    answered here, never forwarded: GET /.watchgate/v1alpha1/top is the
//	                    replica's identities ranked by rejections, opens or open watches per
//	                    budget (top.go; api/top/v1alpha1's TopReport), for callers a
//	                    SubjectAccessReview allows to get watchbudgets/status (cached, on the
//	                    impersonation checks' review budget, fail closed), at most 2 reads a
//	                    second per replica
//	withClassification  RequestInfoFactory: watch (?watch=true and /watch/ paths), list,
//	                    group/resource/namespace/name, selectors, resourceVersion, …
//	withBudgetIdentity  only for what a budget charges: Impersonate-* headers → the budget
//	                    identity, when a SubjectAccessReview (cached, fair per caller) says the
//	                    caller may impersonate
//	withAdmission       coalescing.go, then engine.Decide: stale version → 200 with one ERROR/410
//	                    event in the client's framing; over budget → 429 Status + Retry-After
//	                    after a short bounded delay; X-Watchgate-Decision on every budgeted
//	                    answer; a Warning: 299 header when a budget (DryRun too) says no, once
//	                    a minute per identity and budget (warnings.go). Then an admitted
//	                    watch asks the watch guard (watchguard.go) for a place on the
//	                    replica: 503 above --memory-high-water-percent of
//	                    GOMEMLIMIT, 429 at --max-watches, at --max-watches-per-identity, and
//	                    near either limit beyond the caller's fair share; each with a
//	                    Warning naming the limit, once a minute per caller; last, a watch
//	                    about to go upstream takes one of its caller's watch opens
//	                    (watchopenrate.go: a bucket per caller, --watch-open-burst-per-identity
//	                    refilled at --watch-opens-per-identity-per-second), else 429 WatchOpenRate
//	reverse proxy       httputil.ReverseProxy{Rewrite}, flushed per write, upgrades pass; an
//	                    admitted watch goes upstream over watchgate's own HTTP/2 client
//	                    (watchclient.go), its 200 headers are sent at once (watchheaders.go), its
//	                    stream relayed after them (watchcopy.go): an idle watch waits for
//	                    one byte holding no buffer, a pooled 32 KiB copy buffer only while
//	                    bytes flow
//
// The filters hand what they learn to the next in one requestState in the
// request's context (context.go): the caller, the budget identity, the
// classification, an admitted watch. One value and one copy of the request,
// not one per filter: an open watch keeps them for its whole life.
//
// The upstream transport trusts the API server's CA but carries none of the
// proxy's own credentials: the caller's Authorization and Impersonate-*
// headers go through unchanged, so the API server authenticates and
// authorizes the caller exactly as if it came directly. The proxy's own
// credentials serve only its TokenReviews, SubjectAccessReviews and its
// readiness probe of the API server.
//
// Watch streams are read as they pass (watchstream.go, streaminspector.go):
// the proxy frames JSON and protobuf streams itself in the relay's
// read, without a goroutine or a buffer per idle watch and without holding
// the stream back, and decodes with apimachinery's serializer only frames
// that can be ERROR events; a frame over MaxInspectedFrameBytes (4 MiB) ends
// inspection of that stream. A gzip-encoded stream (kube-apiserver's
// watch-lists to clients that accept gzip: one gzip member per flush) is
// inflated, a copy, member by member (gzipinspector.go) until its first
// frame; after that only the member that ends the stream is inflated, for
// kube-apiserver's ERROR events end their stream: each read's last member
// is held, compressed, until more comes or the stream ends. Inflation is
// bounded per stream (MaxInflatedBytesPerStream), per read and by ratio,
// held bytes per stream and across streams; the inflater is pooled and
// taken only while a member inflates. An ERROR event with code 410 teaches the engine
// that the request's resourceVersion is stale, and the end of every watch
// (how long it lived and whether it failed; a 401/403 is "denied", not a
// failure) goes to engine.WatchEnded exactly once.
//
// A stale version is answered locally only for a watch the API server
// answers 410 when its version is too old, whatever its configuration:
// one without sendInitialEvents and resourceVersionMatch (watch-lists and
// invalid combinations go upstream; classification.fromVersion).
//
// The upstream transport (upstream.go) shares HTTP/2 connections among all
// callers, opens another connection when the API server's stream limit per
// connection is reached instead of waiting for a stream, one at a time
// however many requests wait for it (upstreampool.go), and sizes its
// flow-control windows so that slow clients' unread streams cannot stall
// a connection; Server.UpstreamConnections counts the connections.
//
// Admitted watches, which live for up to an hour and mostly idle, go over
// watchgate's own minimal HTTP/2 client (watchclient.go: the pool, with
// upstreampool.go's rules; watchconn.go: a connection, its one read
// loop and its writes; watchconnstream.go: a watch's stream and body),
// because what net/http's client keeps per stream (a goroutine, ~10 KiB
// of heap) is most of what an idle watch costs the proxy on the upstream
// side. A watch there is a small struct: no goroutine, no timer, no buffer
// while idle; its relaying handler waits on a channel in the stream's
// Read. The connection's flow-control credit goes back as DATA arrives,
// the stream's as the relay reads it, so a slow client buffers at most
// its stream's window and stalls nobody else. Everything else (requests
// that are not admitted watches, upgrades, lists, and every request to
// an API server reached through an HTTP proxy or over plain HTTP) goes
// over net/http.
//
// Concurrent watches from one explicit resourceVersion ask the API server
// once: request coalescing with hand-over (coalescing.go). The first watch
// from a (group, resource, version) is the leader and goes on; the others
// that come while its verdict is unknown are followers and wait (bounded),
// then are decided again, so they get the local 410 once the engine learnt
// the version stale, or go upstream. A leader that learns nothing (its
// client left, it was rejected, the API server failed it) hands over: the
// follower that has waited longest becomes the leader and asks, the others
// follow it, so the storm still costs one upstream WATCH per stale version,
// and a watch that comes later cannot take the place of one that waits.
//
//	watch from resourceVersion N (not "" or "0")
//	  │
//	  ├─ nobody asks about N ──▶ leader: decided, upstream
//	  │                            ├─ ERROR 410 event ─────────▶ settled stale
//	  │                            ├─ other event, quiet 200 ──▶ settled valid
//	  │                            └─ learns nothing ──────────▶ hand-over
//	  │                                                              │
//	  └─ a leader asks ─────────▶ follower waiting ◀─────────────────┘ (the others)
//	                               ├─ handed over ───────▶ leader (the longest waiting)
//	                               ├─ settled stale ─────▶ answered locally: 200, ERROR 410
//	                               ├─ settled valid ─────▶ decided, upstream
//	                               └─ 2 leaders or 5 s ──▶ decided, upstream
//
// Caller-chosen strings in logs are cut (boundedForLog), and a collection
// GET whose query does not parse is logged by the proxy, sampled, instead of
// in full by RequestInfoFactory (classification.go).
//
// Answers the proxy gives itself mirror kube-apiserver's: Status bodies in
// the negotiated media type; the stale-version stream with the API server's
// watch Content-Type ("application/json" for JSON, as kube-apiserver sends
// it, and "application/vnd.kubernetes.protobuf;stream=watch").
//
// Metrics register on controller-runtime's registry, never with a user name
// as a label; docs/operators.md lists every one with its labels (a test in
// test/packaging keeps the list and the code in agreement).
//
// Server is a controller-runtime Runnable that runs on every replica. On
// shutdown readiness drops first; open watches are then closed one by one
// over a grace period, so that their clients do not all reconnect to the other
// replicas at the same instant (the timings: Options.GracefulShutdownTimeout).
package proxy
