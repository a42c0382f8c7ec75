package e2e

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	topv1alpha1 "github.com/watchgate/watchgate/api/top/v1alpha1"
	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// mayGetBudgetStatus is what reading the top endpoint takes.
var mayGetBudgetStatus = rbacv1.PolicyRule{APIGroups: []string{"watchgate.io"}, Resources: []string{"watchbudgets/status"}, Verbs: []string{"get"}}

// recordingUpstream is an HTTPS server that answers /readyz (the proxy's
// readiness probe) and records the path of every other request, as the
// upstream of a proxy whose reviews go to the real API server.
type recordingUpstream struct {
	*httptest.Server
	mu    sync.Mutex
	paths []string
}

func newRecordingUpstream(t *testing.T) *recordingUpstream {
	t.Helper()
	u := &recordingUpstream{}
	u.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			u.mu.Lock()
			u.paths = append(u.paths, r.URL.Path)
			u.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(u.Close)
	return u
}

// config reaches the recorder, trusting its certificate.
func (u *recordingUpstream) config() *rest.Config {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.Certificate().Raw})
	return &rest.Config{Host: u.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
}

func (u *recordingUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.paths)
}

// topProxy starts a proxy in front of a recordingUpstream, its reviews
// (TokenReviews, SubjectAccessReviews, service-account keys) at the real
// API server, with one budget "agents" in whose engine "greedy" was
// refused twice and holds a watch.
func topProxy(t *testing.T) (*testProxy, *recordingUpstream) {
	t.Helper()
	up := newRecordingUpstream(t)
	agents := generous("agents", 10)
	agents.Limits.WatchOpensPerMinute, agents.Limits.WatchBurst = 60, 1
	p := startProxyWith(t, func(o *proxy.Options) {
		o.Upstream, o.Reviews = up.config(), env.Config
		o.ReplicaName = "watchgate-0"
	}, agents)
	now := time.Now()
	for range 3 {
		p.Engine.Decide(now, &ratelimit.Request{User: "greedy", Verb: ratelimit.VerbWatch, Resource: "configmaps"})
	}
	return p, up
}

// The top endpoint, with the real API server's authentication and
// authorization: a user who may get watchbudgets/status reads the
// ranking, a user who may not gets 403, no token 401, all as Status
// bodies, and nothing under /.watchgate/ is forwarded upstream.
func TestTopEndpointAuthorizesWithTheAPIServer(t *testing.T) {
	ns := uniqueName("top")
	reader := serviceAccount(t, ns, "reader", mayGetBudgetStatus)
	outsider := serviceAccount(t, ns, "outsider", readWatch("configmaps"))
	p, up := topProxy(t)

	for name, tc := range map[string]struct {
		token, query string
		code         int
		reason       metav1.StatusReason
	}{
		"a user who may get watchbudgets/status reads it": {token: reader.Token, code: http.StatusOK},
		"one budget, by opens":                            {token: reader.Token, query: "?budget=agents&sort=opens", code: http.StatusOK},
		"a user who may not is 403":                       {token: outsider.Token, code: http.StatusForbidden, reason: metav1.StatusReasonForbidden},
		"no token is 401":                                 {code: http.StatusUnauthorized, reason: metav1.StatusReasonUnauthorized},
		"a token the API server does not know is 401":     {token: "not-a-token", code: http.StatusUnauthorized, reason: metav1.StatusReasonUnauthorized},
		"a bad query from a user who may read it is 400":  {token: reader.Token, query: "?sort=names", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := rawGet(t, p, tc.token, topv1alpha1.Path+tc.query, nil)
			if resp.StatusCode != tc.code {
				t.Fatalf("HTTP %d %s, want %d", resp.StatusCode, body, tc.code)
			}
			if tc.code != http.StatusOK {
				var st metav1.Status
				if err := json.Unmarshal(body, &st); err != nil || st.Kind != "Status" || st.Reason != tc.reason {
					t.Fatalf("body %s, want a Status with reason %s (%v)", body, tc.reason, err)
				}
				return
			}
			var rep topv1alpha1.TopReport
			if err := json.Unmarshal(body, &rep); err != nil {
				t.Fatalf("%v in %s", err, body)
			}
			if rep.Kind != topv1alpha1.Kind || rep.Replica != "watchgate-0" || len(rep.Budgets) != 1 || rep.Budgets[0].Name != "agents" ||
				len(rep.Budgets[0].Identities) != 1 {
				t.Fatalf("report %s, want one budget, agents, listing greedy, from watchgate-0", body)
			}
			if got, want := rep.Budgets[0].Identities[0], (topv1alpha1.IdentityFigures{User: "greedy", Rejections: 2, Opens: 1, Watches: 1}); got != want {
				t.Errorf("greedy's figures %+v, want %+v", got, want)
			}
		})
	}

	// The recorder is a working upstream: an API path reaches it.
	if resp, body := rawGet(t, p, reader.Token, "/version", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /version through the proxy: HTTP %d %s", resp.StatusCode, body)
	}
	seen := up.seen()
	if !slices.Contains(seen, "/version") {
		t.Errorf("the upstream saw %v, want /version among them", seen)
	}
	for _, path := range seen {
		if strings.Contains(path, ".watchgate") {
			t.Errorf("the upstream saw %s: the top endpoint's paths must never be forwarded", path)
		}
	}
}
