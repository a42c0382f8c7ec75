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
	var asked []string
	auth := authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		asked = append(asked, a.GetVerb()+" "+a.GetAPIGroup()+"/"+a.GetResource()+" "+a.GetNamespace()+"/"+a.GetName())
		if a.GetVerb() == "impersonate" && a.GetResource() == "serviceaccounts" && a.GetNamespace() == "ns1" && a.GetName() == "sa1" {
			return authorizer.DecisionAllow, "", nil
		}
		return authorizer.DecisionDeny, "", nil
	})
	got := identityOf(t, auth, callertest.Agent, map[string][]string{"Impersonate-User": {"system:serviceaccount:ns1:sa1"}}, "/api/v1/pods?watch=true")
	want := []string{"system:serviceaccounts", "system:serviceaccounts:ns1", user.AllAuthenticated}
	if got.GetName() != "system:serviceaccount:ns1:sa1" || !slices.Equal(got.GetGroups(), want) {
		t.Errorf("identity = %v, want the service account in %v (asked %q)", got, want, asked)
	}
}

// Constrained impersonation (KEP-5284) is checked as kube-apiserver checks
// it: impersonate-on:<mode>:<verb> on the request's resource, then
// impersonate:<mode> on what is impersonated.
func TestConstrainedImpersonation(t *testing.T) {
	// constrained allows the agent to watch pods as bob in group dev
	// (user-info), and as the service account ns1/sa1.
	constrained := authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		if a.GetUser().GetName() != callertest.Agent.Name {
			return authorizer.DecisionDeny, "", nil
		}
		switch a.GetVerb() + " " + a.GetAPIGroup() + "/" + a.GetResource() + " " + a.GetNamespace() + "/" + a.GetName() {
		case "impersonate-on:user-info:watch /pods /", "impersonate-on:serviceaccount:watch /pods /",
			"impersonate:user-info authentication.k8s.io/users /bob", "impersonate:user-info authentication.k8s.io/groups /dev",
			"impersonate:serviceaccount authentication.k8s.io/serviceaccounts ns1/sa1":
			return authorizer.DecisionAllow, "", nil
		}
		return authorizer.DecisionDeny, "", nil
	})
	for name, tc := range map[string]struct {
		headers    map[string][]string
		path       string
		wantUser   string
		wantGroups []string
	}{
		"user-info charges the user": {
			headers:  map[string][]string{"Impersonate-User": {"bob"}, "Impersonate-Group": {"dev"}},
			wantUser: "bob", wantGroups: []string{"dev", user.AllAuthenticated},
		},
		"serviceaccount charges the service account": {
			headers:  map[string][]string{"Impersonate-User": {"system:serviceaccount:ns1:sa1"}},
			wantUser: "system:serviceaccount:ns1:sa1", wantGroups: []string{"system:serviceaccounts", "system:serviceaccounts:ns1", user.AllAuthenticated},
		},
		"a verb the agent may not use as the user charges the agent": {
			headers: map[string][]string{"Impersonate-User": {"bob"}}, path: "/api/v1/pods",
			wantUser: callertest.Agent.Name, wantGroups: callertest.Agent.Groups,
		},
		"a group the agent may not impersonate charges the agent": {
			headers:  map[string][]string{"Impersonate-User": {"bob"}, "Impersonate-Group": {"ops"}},
			wantUser: callertest.Agent.Name, wantGroups: callertest.Agent.Groups,
		},
		"a service account's groups cannot be chosen in the constrained mode": {
			headers:  map[string][]string{"Impersonate-User": {"system:serviceaccount:ns1:sa1"}, "Impersonate-Group": {"dev"}},
			wantUser: callertest.Agent.Name, wantGroups: callertest.Agent.Groups,
		},
	} {
		t.Run(name, func(t *testing.T) {
			path := tc.path
			if path == "" {
				path = "/api/v1/pods?watch=true"
			}
			got := identityOf(t, constrained, callertest.Agent, tc.headers, path)
			if got.GetName() != tc.wantUser || !slices.Equal(got.GetGroups(), tc.wantGroups) {
				t.Errorf("identity = %v, want %s %v", got, tc.wantUser, tc.wantGroups)
			}
		})
	}
}

// identityOf is the identity WithBudgetIdentity charges a request to path
// with headers from caller.
func identityOf(t *testing.T, auth authorizer.Authorizer, caller user.Info, headers map[string][]string, path string) user.Info {
	t.Helper()
	var got user.Info
	h := request.WithClassification(request.NewRequestInfoFactory(), logtest.Discard(), WithBudgetIdentity(auth, review.FailClosed, nil, logtest.Discard(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = request.IdentityFrom(r.Context())
	})))
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, vs := range headers {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req.WithContext(callertest.WithCaller(req.Context(), caller)))
	if rec.Code != http.StatusOK || got == nil {
		t.Fatalf("HTTP %d %s, identity %v", rec.Code, rec.Body, got)
	}
	return got
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
		constrained         bool
		want                bool
	}{
		"a service account":             {resource: "serviceaccounts", namespace: "ns1"},
		"an extra":                      {resource: "userextras"},
		"a UID":                         {resource: "uids"},
		"a user":                        {resource: "users", want: true},
		"a group":                       {resource: "groups", want: true},
		"a constrained user":            {resource: "users", constrained: true, want: true},
		"a constrained group":           {resource: "groups", constrained: true, want: true},
		"a constrained service account": {resource: "serviceaccounts", namespace: "ns1", constrained: true},
	} {
		t.Run(name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			known := utilcache.NewLRUExpireCacheWithClock(100, clk)
			auth := CachedAuthorizer(allowAll, review.NewCache("impersonation", 100, review.NewBudget(10, 10, 1000, 1000, 100), 4, 10*time.Second, clk), known, time.Minute, 10*time.Second)
			group := ""
			if tc.resource == "userextras" || tc.resource == "uids" {
				group = "authentication.k8s.io"
			}
			verb := "impersonate"
			if tc.constrained {
				group, verb = "authentication.k8s.io", "impersonate:user-info"
				if tc.resource == "serviceaccounts" {
					verb = "impersonate:serviceaccount"
				}
			}
			a := &authorizer.AttributesRecord{User: callertest.Alice, Verb: verb, APIGroup: group, Resource: tc.resource, Namespace: tc.namespace, Name: "x", ResourceRequest: true}
			if d, _, err := auth.Authorize(context.Background(), a); err != nil || d != authorizer.DecisionAllow {
				t.Fatalf("decision %v, %v", d, err)
			}
			if _, got := known.Get(reviewerKeyOf(callertest.Alice)); got != tc.want {
				t.Errorf("privileged after impersonating %s: %v, want %v", name, got, tc.want)
			}
		})
	}
}
