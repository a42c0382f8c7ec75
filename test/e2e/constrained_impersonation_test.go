package e2e

import (
	"net/http"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// An agent allowed only constrained impersonation (KEP-5284, on by default
// since 1.36) is served by the API server as the user it impersonates, so
// watchgate charges that user: in the user-info mode (a user and its
// groups) and in the serviceaccount mode, with the agent holding only the
// impersonate-on:<mode>:watch and impersonate:<mode> verbs.
func TestConstrainedImpersonationChargesTheUser(t *testing.T) {
	ns := uniqueName("constrained")
	everyoneReadsConfigMaps(t, ns)
	victim := serviceAccount(t, ns, "victim", readWatch("configmaps"))
	bob := "bob-" + ns
	agent := serviceAccount(t, ns, "agent",
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{
			"impersonate-on:user-info:watch", "impersonate-on:serviceaccount:watch",
		}},
		rbacv1.PolicyRule{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"users"}, Verbs: []string{"impersonate:user-info"}, ResourceNames: []string{bob}},
		rbacv1.PolicyRule{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"groups"}, Verbs: []string{"impersonate:user-info"}, ResourceNames: []string{"dev"}},
		rbacv1.PolicyRule{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"serviceaccounts"}, Verbs: []string{"impersonate:serviceaccount"}, ResourceNames: []string{"victim"}},
	)
	once := ratelimit.Limits{WatchOpensPerMinute: 1, WatchBurst: 1}
	p := startProxy(t,
		ratelimit.Budget{
			Name: "bob", Precedence: 1, Enforcement: ratelimit.Enforce, Limits: once,
			Subjects: []ratelimit.Subject{{Kind: ratelimit.User, Name: bob}},
		},
		ratelimit.Budget{
			Name: "victim", Precedence: 2, Enforcement: ratelimit.Enforce, Limits: once,
			Subjects: []ratelimit.Subject{{Kind: ratelimit.ServiceAccount, Namespace: ns, Name: "victim"}},
		},
		generous("everyone", 100))

	path := "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=1"
	for name, tc := range map[string]struct {
		headers map[string]string
		budget  string
	}{
		"user-info":      {headers: map[string]string{"Impersonate-User": bob, "Impersonate-Group": "dev"}, budget: "bob"},
		"serviceaccount": {headers: map[string]string{"Impersonate-User": victim.Username()}, budget: "victim"},
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := rawGet(t, p, agent.Token, path, tc.headers)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("HTTP %d %s, want 200 (the API server serves the agent as the user)", resp.StatusCode, body)
			}
			if got, want := resp.Header.Get(proxy.DecisionHeader), "allow; budget="+tc.budget; got != want {
				t.Errorf("%s = %q, want %q (charged to the impersonated user)", proxy.DecisionHeader, got, want)
			}
			resp, _ = rawGet(t, p, agent.Token, path, tc.headers)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("again: HTTP %d, want 429 from the impersonated user's spent budget", resp.StatusCode)
			}
		})
	}

	// Constrained to watches: the same agent listing as bob is refused by
	// the API server, and watchgate charges the agent.
	resp, body := rawGet(t, p, agent.Token, "/api/v1/namespaces/"+ns+"/configmaps", map[string]string{"Impersonate-User": bob})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("list as bob: HTTP %d %s, want the API server's 403", resp.StatusCode, body)
	}
	if got, want := resp.Header.Get(proxy.DecisionHeader), "allow; budget=everyone"; got != want {
		t.Errorf("list as bob: %s = %q, want %q (charged to the agent)", proxy.DecisionHeader, got, want)
	}
}
