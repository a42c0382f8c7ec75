package proxy

import (
	"net/http"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authorization/authorizer"

	"github.com/watchgate/watchgate/proxy/internal/admit"
	"github.com/watchgate/watchgate/proxy/internal/authn"
	"github.com/watchgate/watchgate/proxy/internal/identity"
	"github.com/watchgate/watchgate/proxy/internal/relay"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
	"github.com/watchgate/watchgate/proxy/internal/top"
)

// A step is one filter of the chain, or one sub-step of the admission
// filter, in the order a request meets it. name is the step's heading in
// docs/architecture.md's "One request" walk (chain_test.go keeps the two
// in agreement).
type step struct {
	name string
	// filter wraps the rest of the chain; nil for a sub-step that a filter
	// listed before it runs (the admission filter's) and for what comes
	// after the last filter.
	filter func(next http.Handler) http.Handler
}

// steps is the filter chain, outermost first, with the admission filter's
// sub-steps in the order admit.WithAdmission runs them:
//
//   - the relay at the top comes first, so that an admitted watch's stream
//     is relayed once every filter below has returned (relay.WithRelayAtTop);
//   - authentication before anything that reads the caller; the top
//     endpoint's paths are answered right after it, never classified or
//     forwarded;
//   - classification before identity, because only what a budget charges
//     needs a budget identity (and its SubjectAccessReview);
//   - within admission: coalescing before the budget, so that a follower
//     is decided after its leader learnt whether the version is stale;
//     the budget before the wait for an open seat and the watch guard, so
//     that a watch waits and holds a place on the replica only once its
//     budget admitted it; the seat before the guard, so that a waiting
//     watch holds no place; the watch-open rate last, taken only by a
//     watch about to go upstream;
//   - then the reverse proxy forwards, and the stream is relayed (from the
//     top) and read as it passes.
func steps(tokens authenticator.Token, impersonation authorizer.Authorizer, policy review.FailurePolicy, adm *admit.Admission, topEndpoint http.Handler, logs *sampledlog.Logger) []step {
	return []step{
		{"Relay from the top", relay.WithRelayAtTop},
		{"Authenticate", func(next http.Handler) http.Handler { return authn.WithAuthentication(tokens, policy, logs, next) }},
		{"Answer the top endpoint", func(next http.Handler) http.Handler { return top.WithTop(topEndpoint, next) }},
		{"Classify", func(next http.Handler) http.Handler {
			return request.WithClassification(request.NewRequestInfoFactory(), logs, next)
		}},
		{"Identify", func(next http.Handler) http.Handler {
			return identity.WithBudgetIdentity(impersonation, policy, identity.ChargesOf(adm.Engine), logs, next)
		}},
		{"Coalesce", func(next http.Handler) http.Handler { return admit.WithAdmission(adm, next) }},
		{"Admit", nil},                 // admit.WithAdmission: engine.Decide
		{"Wait for an open seat", nil}, // admit.WithAdmission: the watch opens in flight
		{"Guard the replica", nil},     // admit.WithAdmission: guard.Guard.Admit
		{"Limit watch opens", nil},     // admit.WithAdmission: the watch open rate
		{"Forward", nil},               // forward: upstream.NewReverseProxy
		{"Stream and learn", nil},      // relay.Watch.Relay, from relay.WithRelayAtTop
	}
}

// chain builds the filter chain of steps, once, in front of forward.
func chain(tokens authenticator.Token, impersonation authorizer.Authorizer, policy review.FailurePolicy, adm *admit.Admission, topEndpoint http.Handler, logs *sampledlog.Logger, forward http.Handler) http.Handler {
	s := steps(tokens, impersonation, policy, adm, topEndpoint, logs)
	h := forward
	for i := len(s) - 1; i >= 0; i-- {
		if s[i].filter != nil {
			h = s[i].filter(h)
		}
	}
	return h
}
