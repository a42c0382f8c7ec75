package identity

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/callertest"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/ratelimit"
)

func TestBudgetIdentity(t *testing.T) {
	for name, tc := range map[string]struct {
		caller     user.Info
		headers    map[string][]string
		auth       authorizer.Authorizer
		policy     review.FailurePolicy
		charges    chargesFunc // default: every request is charged
		path       string      // default a watch of pods
		wantCode   int         // default 200
		wantUser   string
		wantGroups []string
	}{
		"without impersonation the caller is charged": {
			caller: callertest.Alice, wantUser: "alice", wantGroups: callertest.Alice.Groups,
		},
		"an allowed impersonation charges the impersonated user": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}},
			wantUser: "bob", wantGroups: []string{user.AllAuthenticated},
		},
		"allowed groups and extras are part of the identity": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}, "Impersonate-Group": {"dev"}, "Impersonate-Extra-Scopes": {"view"}},
			wantUser: "bob", wantGroups: []string{"dev", user.AllAuthenticated},
		},
		"a caller that may not impersonate is charged itself": {
			caller: callertest.Alice, headers: map[string][]string{"Impersonate-User": {"bob"}},
			wantUser: "alice", wantGroups: callertest.Alice.Groups,
		},
		"one group not allowed keeps the caller charged": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}, "Impersonate-Group": {"dev", "system:masters"}},
			wantUser: callertest.Agent.Name, wantGroups: callertest.Agent.Groups,
		},
		"an extra value not allowed keeps the caller charged": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}, "Impersonate-Extra-Scopes": {"admin"}},
			wantUser: callertest.Agent.Name, wantGroups: callertest.Agent.Groups,
		},
		"groups without a user are refused with 400, as by the API server": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-Group": {"dev"}}, wantCode: 400,
		},
		"a failing review fails closed with 503": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}},
			auth: authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
				return authorizer.DecisionAllow, "", errors.New("unreachable")
			}),
			wantCode: 503,
		},
		"a failing review with FailOpen charges the caller, never the impersonated user": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}}, policy: review.FailOpen,
			auth: authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
				return authorizer.DecisionAllow, "", errors.New("unreachable")
			}),
			wantUser: callertest.Agent.Name, wantGroups: callertest.Agent.Groups,
		},
		"throttled reviews get 429": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}},
			auth: authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
				return authorizer.DecisionNoOpinion, "", review.ErrThrottled
			}),
			wantCode: 429,
		},
		"a request no budget decides needs no review": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}}, path: "/version",
			auth: authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
				panic("reviewed")
			}),
			wantUser: callertest.Agent.Name, wantGroups: callertest.Agent.Groups,
		},
		"a watch no budget charges, as the caller or as the impersonated user, needs no review": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}},
			charges: func(*ratelimit.Request) bool { return false },
			auth: authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
				panic("reviewed")
			}),
			wantUser: callertest.Agent.Name, wantGroups: callertest.Agent.Groups,
		},
		"a watch charged only as the impersonated user is reviewed": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}},
			charges:  func(r *ratelimit.Request) bool { return r.Impersonated && r.User == "bob" && r.Resource == "pods" },
			wantUser: "bob", wantGroups: []string{user.AllAuthenticated},
		},
		"a watch charged only as the caller is reviewed": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}},
			charges:  func(r *ratelimit.Request) bool { return !r.Impersonated && r.User == callertest.Agent.Name },
			wantUser: "bob", wantGroups: []string{user.AllAuthenticated},
		},
		"a get of one object needs no review": {
			caller: callertest.Agent, headers: map[string][]string{"Impersonate-User": {"bob"}}, path: "/api/v1/namespaces/a/pods/b",
			auth: authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
				panic("reviewed")
			}),
			wantUser: callertest.Agent.Name, wantGroups: callertest.Agent.Groups,
		},
	} {
		t.Run(name, func(t *testing.T) {
			auth := tc.auth
			if auth == nil {
				auth = callertest.Impersonation
			}
			policy := tc.policy
			if policy == "" {
				policy = review.FailClosed
			}
			path := tc.path
			if path == "" {
				path = "/api/v1/pods?watch=true"
			}
			wantCode := tc.wantCode
			if wantCode == 0 {
				wantCode = 200
			}
			var got user.Info
			h := request.WithClassification(request.NewRequestInfoFactory(), logtest.Discard(), WithBudgetIdentity(auth, policy, tc.charges, logtest.Discard(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got, _ = request.IdentityFrom(r.Context())
			})))
			req := httptest.NewRequest(http.MethodGet, path, nil)
			for k, vs := range tc.headers {
				for _, v := range vs {
					req.Header.Add(k, v)
				}
			}
			before := req.Header.Clone()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req.WithContext(callertest.WithCaller(req.Context(), tc.caller)))
			if rec.Code != wantCode {
				t.Fatalf("HTTP %d %s, want %d", rec.Code, rec.Body, wantCode)
			}
			if wantCode != 200 {
				return
			}
			if got == nil || got.GetName() != tc.wantUser || !slices.Equal(got.GetGroups(), tc.wantGroups) {
				t.Fatalf("identity = %v, want %s %v", got, tc.wantUser, tc.wantGroups)
			}
			if len(req.Header) != len(before) {
				t.Errorf("headers changed: %v, were %v", req.Header, before)
			}
		})
	}
}

func TestImpersonatingAServiceAccountChecksServiceAccounts(t *testing.T) {
	target, checks, _ := ImpersonationRequest(callertest.Agent, http.Header{"Impersonate-User": {"system:serviceaccount:ns1:sa1"}})
	if len(checks) != 1 || checks[0].GetResource() != "serviceaccounts" || checks[0].GetNamespace() != "ns1" || checks[0].GetName() != "sa1" {
		t.Fatalf("checks = %+v, want impersonate serviceaccounts ns1/sa1", checks)
	}
	want := []string{"system:serviceaccounts", "system:serviceaccounts:ns1", user.AllAuthenticated}
	if !slices.Equal(target.GetGroups(), want) {
		t.Errorf("groups = %v, want %v", target.GetGroups(), want)
	}
}

func TestImpersonationCache(t *testing.T) {
	var calls atomic.Int64
	inner := authorizer.AuthorizerFunc(func(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		calls.Add(1)
		return callertest.Impersonation.Authorize(ctx, a)
	})
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	auth := CachedAuthorizer(inner, review.NewCache("impersonation", 100, review.NewBudget(10, 10, 1000, 1000, 100), 4, 10*time.Second, clk), utilcache.NewLRUExpireCacheWithClock(100, clk), time.Minute, 10*time.Second)
	check := func(caller user.Info, name string) authorizer.Decision {
		d, _, err := auth.Authorize(context.Background(), &authorizer.AttributesRecord{User: caller, Verb: "impersonate", Resource: "users", Name: name, ResourceRequest: true})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for range 3 {
		if check(callertest.Agent, "bob") != authorizer.DecisionAllow || check(callertest.Alice, "bob") != authorizer.DecisionDeny {
			t.Fatal("cached answers differ from the reviewer's")
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("reviews = %d, want 2 (one per caller)", n)
	}
	clk.Step(11 * time.Second)
	check(callertest.Agent, "bob")
	check(callertest.Alice, "bob")
	if n := calls.Load(); n != 3 {
		t.Fatalf("reviews after 11s = %d, want 3 (only the denial expired)", n)
	}
}

// Only callers allowed to impersonate users or groups join the privileged
// lane: the built-in edit role may impersonate its namespace's service
// accounts, so any namespace editor would.
func TestOnlyImpersonatingUsersOrGroupsEarnsThePrivilegedLane(t *testing.T) {
	allowAll := authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
		return authorizer.DecisionAllow, "", nil
	})
	for name, tc := range map[string]struct {
		resource, namespace string
		want                bool
	}{
		"a service account": {resource: "serviceaccounts", namespace: "ns1"},
		"an extra":          {resource: "userextras"},
		"a UID":             {resource: "uids"},
		"a user":            {resource: "users", want: true},
		"a group":           {resource: "groups", want: true},
	} {
		t.Run(name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			known := utilcache.NewLRUExpireCacheWithClock(100, clk)
			auth := CachedAuthorizer(allowAll, review.NewCache("impersonation", 100, review.NewBudget(10, 10, 1000, 1000, 100), 4, 10*time.Second, clk), known, time.Minute, 10*time.Second)
			group := ""
			if tc.resource == "userextras" || tc.resource == "uids" {
				group = "authentication.k8s.io"
			}
			a := &authorizer.AttributesRecord{User: callertest.Alice, Verb: "impersonate", APIGroup: group, Resource: tc.resource, Namespace: tc.namespace, Name: "x", ResourceRequest: true}
			if d, _, err := auth.Authorize(context.Background(), a); err != nil || d != authorizer.DecisionAllow {
				t.Fatalf("decision %v, %v", d, err)
			}
			if _, got := known.Get(reviewerKeyOf(callertest.Alice)); got != tc.want {
				t.Errorf("privileged after impersonating %s: %v, want %v", name, got, tc.want)
			}
		})
	}
}
