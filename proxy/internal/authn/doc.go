// Package authn says who the caller is: WithAuthentication reads the
// bearer token as kube-apiserver reads it (RequestToken: the
// Authorization header and the WebSocket protocol token; 400 where the two
// could read it differently, so a new credential header is read here),
// verifies service-account JWTs locally against the API server's published
// keys and their bound service account, pod or node, whose deletions it
// watches (ServiceAccountTokens), and every other token by TokenReview
// (CachedTokens, within proxy/internal/review's budgets), and leaves the
// caller in the request's state. No token or a bad one: 401, nothing
// forwarded.
//
// It does not decide whose budget a request spends (identity) nor what the
// caller may do: the API server authenticates and authorizes the forwarded
// request again. proxy's chain runs it second, after the relay at the top.
package authn
