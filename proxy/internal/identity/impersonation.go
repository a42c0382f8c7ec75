package identity

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
	"github.com/watchgate/watchgate/ratelimit"
)

// WithBudgetIdentity decides whose budget a request spends. Without
// Impersonate-* headers it is the caller's. With them it is the
// impersonated user's — but only when kube-apiserver would serve the
// request as that user: kube-apiserver's own impersonation filter
// (impersonation.WithConstrainedImpersonation, the one 1.36+ runs) decides
// on a copy of the request, with auth answering its checks, in every mode
// it knows: legacy ("impersonate" on the user, groups, extras and UID) and
// constrained (KEP-5284: "impersonate-on:<mode>:<verb>" on the request's
// resource, then "impersonate:<mode>" on the user, groups, extras and UID,
// for the modes user-info, serviceaccount, arbitrary-node and
// associated-node). Otherwise it stays the caller's, and the request is
// forwarded all the same: the API server answers 403 itself. So no caller
// can spend or enlarge another identity's budget with headers it may not
// use.
//
// It runs after classification, and reviews only requests a budget
// decides (watches and lists of resources): /version, gets, writes and
// everything else pass without a SubjectAccessReview. So do watches and
// lists that charges says no budget charges, neither as the caller nor as
// the impersonated identity (no budget governs them, or only Exempt
// ones): their decision cannot depend on the review, and the API server
// authorizes the impersonation itself. A nil charges charges everything. Impersonation
// headers kube-apiserver refuses with 400 (groups, extras or a UID without
// a user) get 400 here. When the reviews are throttled the request gets
// 429; when they fail, 503 (FailClosed) or it is charged to the caller
// (FailOpen) — never to the impersonated user.
func WithBudgetIdentity(auth authorizer.Authorizer, policy review.FailurePolicy, charges chargesFunc, log *sampledlog.Logger, next http.Handler) http.Handler {
	servedAs := newServedAs(auth)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, ok := request.CallerFrom(r.Context())
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		target, err := ImpersonationRequest(caller, r.Header)
		if err != nil {
			answer.WriteStatus(w, r, apierrors.NewBadRequest(err.Error()))
			return
		}
		c, ok := request.ClassificationFrom(r.Context())
		if target == nil || review.IsUnreviewed(caller) || !ok || c.Verb == 0 ||
			charges != nil && !charges(budgetRequest(caller, c, false)) && !charges(budgetRequest(target, c, true)) {
			next.ServeHTTP(w, r)
			return
		}
		served, err := servedAs.user(r, caller)
		switch {
		case served != nil:
			st, r := request.StateOf(r)
			st.Identity = served
			next.ServeHTTP(w, r)
		case err != nil:
			if policy.Failed(w, r, review.Impersonation, err, log, "caller", caller.GetName()) {
				next.ServeHTTP(w, r)
			}
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// chargesFunc tells whether a budget charges r (ratelimit.Policy.Charges).
type chargesFunc func(r *ratelimit.Request) bool

// ChargesOf asks the engine's current policy, when the engine has one (a
// *ratelimit.Engine does); nil otherwise.
func ChargesOf(e any) chargesFunc {
	p, ok := e.(interface{ Policy() *ratelimit.Policy })
	if !ok {
		return nil
	}
	return func(r *ratelimit.Request) bool { return p.Policy().Charges(r) }
}

// budgetRequest is what the engine matches budgets by, for the request
// classified c charged to u.
func budgetRequest(u user.Info, c *request.Classification, impersonated bool) *ratelimit.Request {
	return &ratelimit.Request{
		User: u.GetName(), Groups: u.GetGroups(), Verb: c.Verb,
		Group: c.APIGroup, Resource: c.Resource, Namespace: c.Namespace,
		Impersonated: impersonated,
	}
}

// ImpersonationRequest returns the user the headers ask to act as, as
// kube-apiserver's impersonation filter reads them and would serve the
// request if every check passed (a service account's groups filled in,
// system:authenticated or system:unauthenticated added); nil when the
// headers ask for nothing; an error where kube-apiserver answers 400
// (groups, extras or a UID without a user). Whether the caller may is
// WithBudgetIdentity's question.
func ImpersonationRequest(caller user.Info, h http.Header) (user.Info, error) {
	name := h.Get(authenticationv1.ImpersonateUserHeader)
	if name == "" {
		if len(h[authenticationv1.ImpersonateGroupHeader]) > 0 || h.Get(authenticationv1.ImpersonateUIDHeader) != "" || hasExtraHeader(h) {
			return nil, errors.New("impersonation of groups, extras or a UID requires impersonating a user")
		}
		return nil, nil
	}
	target := &user.DefaultInfo{Name: name}
	if ns, _, err := serviceaccount.SplitUsername(name); err == nil && len(h[authenticationv1.ImpersonateGroupHeader]) == 0 {
		target.Groups = serviceaccount.MakeGroupNames(ns)
	}
	target.Groups = append(target.Groups, h[authenticationv1.ImpersonateGroupHeader]...)
	for header, values := range h {
		if !strings.HasPrefix(header, authenticationv1.ImpersonateUserExtraHeaderPrefix) {
			continue
		}
		key := strings.ToLower(header[len(authenticationv1.ImpersonateUserExtraHeaderPrefix):])
		if k, err := url.PathUnescape(key); err == nil {
			key = k
		}
		for _, v := range values {
			if target.Extra == nil {
				target.Extra = map[string][]string{}
			}
			target.Extra[key] = append(target.Extra[key], v)
		}
	}
	target.UID = h.Get(authenticationv1.ImpersonateUIDHeader)
	// As kube-apiserver: a non-anonymous user is authenticated unless the
	// groups say otherwise.
	if name != user.Anonymous {
		if !slices.Contains(target.Groups, user.AllAuthenticated) && !slices.Contains(target.Groups, user.AllUnauthenticated) {
			target.Groups = append(target.Groups, user.AllAuthenticated)
		}
	} else if !slices.Contains(target.Groups, user.AllUnauthenticated) {
		target.Groups = append(target.Groups, user.AllUnauthenticated)
	}
	return target, nil
}

func hasExtraHeader(h http.Header) bool {
	for header := range h {
		if strings.HasPrefix(header, authenticationv1.ImpersonateUserExtraHeaderPrefix) {
			return true
		}
	}
	return false
}

// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// SubjectAccessReviewer asks the SubjectAccessReview API, through the
// proxy's own client, whether the attributes' user may do what they say.
func SubjectAccessReviewer(client authorizationv1client.SubjectAccessReviewInterface) authorizer.Authorizer {
	return authorizer.AuthorizerFunc(func(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		u := a.GetUser()
		extra := map[string]authorizationv1.ExtraValue{}
		for k, v := range u.GetExtra() {
			extra[k] = v
		}
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.GetName(), UID: u.GetUID(), Groups: u.GetGroups(), Extra: extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.GetVerb(), Group: a.GetAPIGroup(), Resource: a.GetResource(),
				Subresource: a.GetSubresource(), Namespace: a.GetNamespace(), Name: a.GetName(),
			},
		}}
		sar, err := client.Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return authorizer.DecisionNoOpinion, "", fmt.Errorf("create SubjectAccessReview: %w", err)
		}
		if sar.Status.Allowed {
			return authorizer.DecisionAllow, sar.Status.Reason, nil
		}
		return authorizer.DecisionDeny, sar.Status.Reason, nil
	})
}

// authorizerAnswer is what the impersonation cache remembers.
type authorizerAnswer struct {
	decision authorizer.Decision
	reason   string
}

// CachedAuthorizer wraps an authorizer with a review.Cache keyed by the
// user's full identity and the attributes checked. Each caller (the
// attributes' user) spends its own review budget; callers that were
// allowed to impersonate users or groups (earnsPrivilege) within the last
// knownImpersonatorTTL skip the
// shared bucket (review.Budget), so a flood from callers without rights
// cannot starve an authorised agent's checks. known holds those callers,
// by hash, bounded in count.
func CachedAuthorizer(inner authorizer.Authorizer, cache *review.Cache, known *utilcache.LRUExpireCache, ttl, negativeTTL time.Duration) authorizer.Authorizer {
	return authorizer.AuthorizerFunc(func(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		requester := reviewerKeyOf(a.GetUser())
		lane := review.LaneNew
		if _, ok := known.Get(requester); ok {
			lane = review.LaneTrusted
		}
		v, err := cache.Get(ctx, attributesKey(a), requester, lane, func(ctx context.Context) (any, time.Duration, error) {
			d, reason, err := inner.Authorize(ctx, a)
			if err != nil {
				return nil, 0, err
			}
			if d == authorizer.DecisionAllow {
				return authorizerAnswer{d, reason}, ttl, nil
			}
			return authorizerAnswer{d, reason}, negativeTTL, nil
		})
		if err != nil {
			return authorizer.DecisionNoOpinion, "", err
		}
		ans := v.(authorizerAnswer)
		if ans.decision == authorizer.DecisionAllow && earnsPrivilege(a) {
			known.Add(requester, struct{}{}, knownImpersonatorTTL)
		}
		return ans.decision, ans.reason, nil
	})
}

// earnsPrivilege reports whether being allowed a makes its user a known
// impersonator: only impersonating users or groups does, in the legacy
// mode (the core group) or the constrained user-info mode
// (authentication.k8s.io). Impersonating a namespace's service accounts is
// in the built-in edit role, so every namespace editor would otherwise
// join the privileged lane.
func earnsPrivilege(a authorizer.Attributes) bool {
	switch {
	case a.GetResource() != "users" && a.GetResource() != "groups":
		return false
	case a.GetAPIGroup() == "":
		return a.GetVerb() == "impersonate"
	case a.GetAPIGroup() == authenticationv1.GroupName:
		return a.GetVerb() == "impersonate:user-info"
	}
	return false
}

// knownImpersonatorTTL is how long a caller that was allowed an
// impersonation keeps its privileged review budget.
const knownImpersonatorTTL = 10 * time.Minute

// reviewerKeyOf identifies a caller by a hash of its name and UID.
func reviewerKeyOf(u user.Info) string {
	h := sha256.New()
	h.Write([]byte(u.GetName()))
	h.Write([]byte{0})
	h.Write([]byte(u.GetUID()))
	return hex.EncodeToString(h.Sum(nil))
}

// attributesKey hashes everything a SubjectAccessReview depends on.
func attributesKey(a authorizer.Attributes) string {
	h := sha256.New()
	field := func(s string) { h.Write([]byte(s)); h.Write([]byte{0}) }
	u := a.GetUser()
	field(u.GetName())
	field(u.GetUID())
	groups := slices.Clone(u.GetGroups())
	slices.Sort(groups)
	for _, g := range groups {
		field(g)
	}
	field("\x01")
	extra := u.GetExtra()
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		field(k)
		for _, v := range extra[k] {
			field(v)
		}
		field("\x01")
	}
	for _, s := range []string{a.GetVerb(), a.GetAPIGroup(), a.GetResource(), a.GetSubresource(), a.GetNamespace(), a.GetName()} {
		field(s)
	}
	return hex.EncodeToString(h.Sum(nil))
}
