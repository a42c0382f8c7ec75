// Package proxy is watchgate's data path: an HTTPS reverse proxy that stands
// in front of kube-apiserver and admits watches (and budgeted lists) through
// the ratelimit engine. Clients change nothing but the server URL.
//
// A request goes through a chain of filters, each shaped
// func(deps…, next http.Handler) http.Handler and built once by NewServer:
//
//	withGrownStack      grows the handler goroutine's stack to 8 KiB once, while it is shallow
//	                    (stack.go), instead of copying it deep inside the filters
//	withAuthentication  bearer token, read as kube-apiserver reads it (headers.go; 400 where the two
//	                    could differ) → service-account JWTs verified locally against the API
//	                    server's published keys (serviceaccount_tokens.go), every other token by
//	                    TokenReview (cached, fair per client address, bounded); 401 without forwarding
//	withClassification  RequestInfoFactory: watch (?watch=true and /watch/ paths), list,
//	                    group/resource/namespace/name, selectors, resourceVersion, …
//	withBudgetIdentity  only for what a budget decides: Impersonate-* headers → the budget
//	                    identity, when a SubjectAccessReview (cached, fair per caller) says the
//	                    caller may impersonate
//	withWatchGuard      the replica's own limits, before any budget: new watches get 503 above
//	                    --memory-high-water-percent of GOMEMLIMIT, 429 at --max-watches
//	withAdmission       engine.Decide: stale version → 200 with one ERROR/410 event in
//	                    the client's framing; over budget → 429 Status + Retry-After after
//	                    a short bounded delay; X-Watchgate-Decision on every budgeted answer
//	reverse proxy       httputil.ReverseProxy{Rewrite}, flushed per write, upgrades pass; an
//	                    admitted watch's 200 headers are sent at once (watchheaders.go)
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
// the proxy frames JSON and protobuf streams itself in the reverse proxy's
// read, without a goroutine or a buffer per idle watch and without holding
// the stream back, and decodes with apimachinery's serializer only frames
// that can be ERROR events; a frame over MaxInspectedFrameBytes (4 MiB) ends
// inspection of that stream. A gzip-encoded stream (kube-apiserver's
// watch-lists to clients that accept gzip: one gzip member per flush) is
// inflated, a copy, member by member (gzipinspector.go), bounded per
// stream (MaxInflatedBytesPerStream), per read and by ratio; the inflater
// is pooled and taken only while a member inflates. An ERROR event with code 410 teaches the engine
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
// connection is reached instead of waiting for a stream, and sizes its
// flow-control windows so that slow clients' unread streams cannot stall
// a connection; Server.UpstreamConnections counts the connections.
//
// Concurrent watches from one explicit resourceVersion ask the API server
// once (pendingversions.go): while the first one's verdict is unknown its
// twins wait (bounded), then are decided again, so they get the local 410
// once the engine learnt the version stale, or go upstream. A first watch
// that learns nothing (its client left, it was rejected, the API server
// failed it) hands over: the twin that has waited longest asks in its place
// and the others wait for that one, so the storm still costs one upstream
// WATCH per stale version, and a watch that comes later cannot take the
// place of one that waits.
//
// StackBallast (stackballast.go), a Runnable main adds to the manager,
// keeps the runtime's starting stack for new goroutines at the 4 KiB a bare
// proxy runs at, which the operator's many shallow idle goroutines would
// otherwise pull down to 2 KiB: net/http's per-request goroutines then
// grow, and copy, their stacks on every request.
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
// Metrics (controller-runtime's registry, no user names as labels):
// watchgate_proxy_requests_total{verb,decision,reason,budget,enforcement},
// watchgate_proxy_active_watches, watchgate_proxy_upstream_watch_opens_total,
// watchgate_proxy_upstream_connections,
// watchgate_proxy_watches_ended_total{outcome}, watchgate_proxy_watches_held_total,
// watchgate_proxy_stale_versions_learned_total,
// watchgate_proxy_decision_duration_seconds{verb},
// watchgate_proxy_review_cache_lookups_total{review,result},
// watchgate_proxy_reviews_throttled_total{review},
// watchgate_proxy_reviews_sent_total{review}, watchgate_proxy_reviews_failed_total{review},
// watchgate_proxy_review_fail_open_total{review},
// watchgate_proxy_local_token_verifications_total{result},
// watchgate_proxy_service_account_key_refreshes_total{result},
// watchgate_proxy_credentials_refused_total{reason},
// watchgate_proxy_logs_suppressed_total,
// watchgate_proxy_guard_rejections_total{reason},
// watchgate_proxy_memory_in_use_bytes, watchgate_proxy_memory_limit_bytes.
//
// Server is a controller-runtime Runnable that runs on every replica. On
// shutdown readiness drops first; open watches are then closed one by one
// over a grace period, so that their clients do not all reconnect to the other
// replicas at the same instant (the timings: Options.GracefulShutdownTimeout).
package proxy
