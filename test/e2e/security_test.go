package e2e

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// The proxy forwards the caller's credentials and nothing of its own: a
// token without rights gets the same 403 through the proxy as directly.
func TestTokenWithoutRightsGetsTheSame403(t *testing.T) {
	ctx := context.Background()
	sa := serviceAccount(t, "rights", "nobody")
	p := startProxy(t, generous("everyone", 100))

	direct, err := kubernetes.NewForConfig(env.ConfigFor(sa.Token, "", nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, protobuf := range []bool{false, true} {
		proxied, err := kubernetes.NewForConfig(p.Config(sa.Token, protobuf))
		if err != nil {
			t.Fatal(err)
		}
		calls := map[string]func(kubernetes.Interface) error{
			"list secrets": func(cs kubernetes.Interface) error {
				_, err := cs.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
				return err
			},
			"watch secrets": func(cs kubernetes.Interface) error {
				w, err := cs.CoreV1().Secrets("default").Watch(ctx, metav1.ListOptions{})
				if err == nil {
					w.Stop()
				}
				return err
			},
			"get namespace": func(cs kubernetes.Interface) error {
				_, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
				return err
			},
		}
		for name, call := range calls {
			want, got := statusOf(call(direct)), statusOf(call(proxied))
			if want == nil || want.Code != http.StatusForbidden {
				t.Fatalf("%s directly: want 403, got %+v", name, want)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s (protobuf=%v) through the proxy:\n got %+v\nwant %+v", name, protobuf, got, want)
			}
		}
	}

	// No token, or a bad one: 401 from the proxy itself.
	for name, token := range map[string]string{"no token": "", "bad token": "not-a-token"} {
		resp, body := rawGet(t, p, token, "/api/v1/namespaces", nil)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: HTTP %d %s, want 401", name, resp.StatusCode, body)
		}
	}
}

func statusOf(err error) *metav1.Status {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return nil
	}
	s := se.Status()
	return &s
}

// A caller that may not impersonate cannot spend another identity's budget
// with Impersonate-User; one that may, spends the impersonated user's.
func TestImpersonationChargesOnlyWhenAllowed(t *testing.T) {
	ns := uniqueName("impersonation")
	victim := serviceAccount(t, ns, "victim", readWatch("configmaps"))
	mallory := serviceAccount(t, ns, "mallory", readWatch("configmaps"))
	agent := serviceAccount(t, ns, "agent", rbacv1.PolicyRule{
		APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"impersonate"}, ResourceNames: []string{"victim"},
	})
	victimBudget := ratelimit.Budget{
		Name: "victim", Precedence: 1, Enforcement: ratelimit.Enforce,
		Subjects: []ratelimit.Subject{{Kind: ratelimit.ServiceAccount, Namespace: ns, Name: "victim"}},
		Limits:   ratelimit.Limits{WatchOpensPerMinute: 1, WatchBurst: 1},
	}
	p := startProxy(t, victimBudget, generous("everyone", 100))

	path := "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=1"
	asVictim := map[string]string{"Impersonate-User": victim.Username()}

	for range 3 {
		resp, body := rawGet(t, p, mallory.Token, path, asVictim)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("mallory impersonating: HTTP %d %s, want the API server's 403", resp.StatusCode, body)
		}
		if got, want := resp.Header.Get(proxy.DecisionHeader), "allow; budget=everyone"; got != want {
			t.Errorf("mallory impersonating: %s = %q, want %q (charged to mallory)", proxy.DecisionHeader, got, want)
		}
	}
	resp, body := rawGet(t, p, agent.Token, path, asVictim)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("agent impersonating the victim: HTTP %d %s, want 200", resp.StatusCode, body)
	}
	if got, want := resp.Header.Get(proxy.DecisionHeader), "allow; budget=victim"; got != want {
		t.Errorf("agent impersonating: %s = %q, want %q (the victim's budget was intact)", proxy.DecisionHeader, got, want)
	}
	resp, _ = rawGet(t, p, agent.Token, path, asVictim)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("agent impersonating again: HTTP %d, want 429 from the victim's spent budget", resp.StatusCode)
	}
}
