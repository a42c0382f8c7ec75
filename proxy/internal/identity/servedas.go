package identity

import (
	"context"
	"fmt"
	"net/http"

	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/filters/impersonation"
	genericrequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/request"
)

// servedAs runs kube-apiserver's impersonation filter
// (impersonation.WithConstrainedImpersonation) on a copy of a request to
// learn whom the API server would serve it as. The filter is built once;
// it keeps kube-apiserver's own caches: each caller's last successful
// mode (at most 10,000 callers) and its allowed impersonations for 10 s.
type servedAs struct {
	filter http.Handler
	infos  *genericrequest.RequestInfoFactory
}

func newServedAs(auth authorizer.Authorizer) *servedAs {
	// The filter turns an authorizer's error into a refusal of that mode
	// and tries the next one; failedAuth remembers the first error, so
	// that a request no mode allowed because reviews failed is told apart
	// from one the reviews refused.
	failedAuth := authorizer.AuthorizerFunc(func(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		d, reason, err := auth.Authorize(ctx, a)
		if err != nil {
			if o, ok := ctx.Value(outcomeKey{}).(*outcome); ok && o.err == nil {
				o.err = err
			}
			return authorizer.DecisionNoOpinion, reason, err
		}
		return d, reason, nil
	})
	served := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if o, ok := r.Context().Value(outcomeKey{}).(*outcome); ok {
			o.user, _ = genericrequest.UserFrom(r.Context())
		}
	})
	return &servedAs{
		filter: impersonation.WithConstrainedImpersonation(served, failedAuth, answer.MetaCodecs),
		infos:  request.NewRequestInfoFactory(),
	}
}

// outcome is what one run of the filter found: the user the request is
// served as (nil: refused), and the first error of a review.
type outcome struct {
	user user.Info
	err  error
}

type outcomeKey struct{}

// user returns the user kube-apiserver would serve r, sent by caller, as;
// nil when it would refuse r (403 or 400), with the first review error
// when a review failed (or r could not be read).
func (s *servedAs) user(r *http.Request, caller user.Info) (user.Info, error) {
	info, err := s.infos.NewRequestInfo(r)
	if err != nil {
		// Not reached: classification read the same request with the same
		// factory.
		return nil, fmt.Errorf("read the request as kube-apiserver: %w", err)
	}
	o := &outcome{}
	ctx := context.WithValue(r.Context(), outcomeKey{}, o)
	ctx = genericrequest.WithRequestInfo(genericrequest.WithUser(ctx, caller), info)
	// The filter deletes the Impersonate-* headers of the request it
	// serves; Clone copies them.
	s.filter.ServeHTTP(discard{}, r.Clone(ctx))
	if o.user != nil {
		return o.user, nil
	}
	return nil, o.err
}

// discard is where the filter's refusals go: the API server answers the
// client itself.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}
