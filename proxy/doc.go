// Package proxy is watchgate's data path: an HTTPS reverse proxy that stands
// in front of kube-apiserver and admits watches (and budgeted lists) through
// the ratelimit engine. Clients change nothing but the server URL.
//
// This package is the server's face: Options (flags, defaults, Validate),
// NewServer (the wiring: every cache and review budget on a line of its
// own), Server (a controller-runtime Runnable on every replica: listen,
// TLS and HTTP/2, readiness, graceful shutdown) and chain.go, which lists
// the filters and the admission filter's sub-steps in the order a request
// meets them (docs/architecture.md walks the same list; a test compares
// them):
//
//	Relay from the top       internal/relay     WithRelayAtTop: grows the handler's stack once and relays
//	                                            an admitted watch's stream after the filters returned
//	Authenticate             internal/authn     bearer token read as kube-apiserver reads it; service-account
//	                                            JWTs verified locally, other tokens by TokenReview; 401
//	Answer the top endpoint  internal/top       /.watchgate/… answered here, never forwarded
//	Classify                 internal/request   RequestInfoFactory plus what a budget reads from the query
//	Identify                 internal/identity  Impersonate-* → the budget identity, if a SubjectAccessReview allows
//	Coalesce                 internal/coalesce  watches from one stale-able resourceVersion ask the API server once
//	Admit                    internal/admit     engine.Decide: 429 + Retry-After, or the local 410 answer
//	Guard the replica        internal/guard     memory high water, --max-watches, per identity, fair share
//	Limit watch opens        internal/admit     a bucket of watch opens per caller
//	Forward                  internal/upstream  ReverseProxy{Rewrite}; shared HTTP/2 connections; admitted
//	                                            watches over watchgate's own HTTP/2 client
//	Stream and learn         internal/relay     the stream relayed and read as it passes (internal/inspect):
//	                                            an ERROR 410 teaches the engine a stale version
//
// The rooms below, one idea each, which the compiler keeps apart:
//
//	internal/request    what the filters learn about a request (its State in the context) and its
//	                    classification: a new field read from the URL or query
//	internal/authn      who the caller is: a new credential header or token kind
//	internal/review     cached, fair, rate-limited TokenReviews and SubjectAccessReviews and the
//	                    review failure policy, shared by authn, identity and top
//	internal/identity   whose budget a request spends (impersonation)
//	internal/top        the top endpoint
//	internal/admit      the admission filter, its warnings and the per-caller watch open rate: the
//	                    order of admission's sub-steps, a new reason of the caller's own rate
//	internal/guard      the replica's share of watches and the memory it reads: a new reason to
//	                    refuse a watch for the replica's sake
//	internal/coalesce   request coalescing with hand-over
//	internal/relay      one admitted watch's life: its end told to the engine exactly once, its
//	                    stream relayed and read, the open watches closed one by one on shutdown
//	internal/inspect    reading watch streams (JSON, protobuf, gzip): a new stream format
//	internal/upstream   the reverse proxy, its transport and pool, watchgate's HTTP/2 watch client:
//	                    a new upstream setting
//	internal/serve      how the Server listens: its certificate, the connection limits, HTTP/2
//	internal/answer     Status bodies, the decision header, the local stale-version answer
//	internal/sampledlog the rate-limited logger
//
// and test doubles of their own: internal/enginetest (a fake engine),
// internal/callertest (test callers and their authenticator and
// authorizers), internal/streamtest (watch streams and their oracle),
// internal/upstreamtest (API-server stand-ins), internal/logtest,
// internal/metricstest.
//
// The filters hand what they learn to the next in one request.State in the
// request's context: the caller, the budget identity, the classification,
// an admitted watch. One value and one copy of the request, not one per
// filter: an open watch keeps them for its whole life.
//
// The upstream transport trusts the API server's CA but carries none of the
// proxy's own credentials: the caller's Authorization and Impersonate-*
// headers go through unchanged, so the API server authenticates and
// authorizes the caller exactly as if it came directly. The proxy's own
// credentials serve only its TokenReviews, SubjectAccessReviews and its
// readiness probe of the API server.
//
// Concurrent watches from one explicit resourceVersion ask the API server
// once: request coalescing with hand-over (internal/coalesce). The first
// watch from a (group, resource, version) is the leader and goes on; the
// others that come while its verdict is unknown are followers and wait
// (bounded), then are decided again, so they get the local 410 once the
// engine learnt the version stale, or go upstream. A leader that learns
// nothing (its client left, it was rejected, the API server failed it)
// hands over: the follower that has waited longest becomes the leader and
// asks, the others follow it, so the storm still costs one upstream WATCH
// per stale version, and a watch that comes later cannot take the place of
// one that waits.
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
// A stale version is answered locally only for a watch the API server
// answers 410 when its version is too old, whatever its configuration:
// one without sendInitialEvents and resourceVersionMatch (watch-lists and
// invalid combinations go upstream; request.Classification.FromVersion).
//
// Answers the proxy gives itself mirror kube-apiserver's: Status bodies in
// the negotiated media type; the stale-version stream with the API server's
// watch Content-Type ("application/json" for JSON, as kube-apiserver sends
// it, and "application/vnd.kubernetes.protobuf;stream=watch").
// Caller-chosen strings in logs are cut (sampledlog.Bounded).
//
// Metrics register on controller-runtime's registry, each in the package
// that counts it, never with a user name as a label; docs/operators.md
// lists every one with its labels (a test in test/packaging keeps the list
// and the code in agreement).
//
// Server is a controller-runtime Runnable that runs on every replica. On
// shutdown readiness drops first; open watches are then closed one by one
// over a grace period, so that their clients do not all reconnect to the other
// replicas at the same instant (the timings: Options.GracefulShutdownTimeout).
package proxy
