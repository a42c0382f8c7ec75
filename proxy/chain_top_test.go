package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	topv1alpha1 "github.com/watchgate/watchgate/api/top/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

// topTestProxy serves the chain with a real engine in which "greedy" was
// refused twice and holds one watch and "holder" holds one, in front of an
// upstream that counts what reaches it.
func topTestProxy(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	engine := ratelimit.NewEngine(ratelimit.Options{Seed: 1})
	policy, err := ratelimit.NewPolicy([]ratelimit.Budget{{Name: "agents", Limits: ratelimit.Limits{WatchOpensPerMinute: 60, WatchBurst: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	engine.SetPolicy(now, policy)
	for _, u := range []string{"greedy", "greedy", "greedy", "holder"} {
		engine.Decide(now, &ratelimit.Request{User: u, Verb: ratelimit.VerbWatch, Resource: "configmaps"})
	}
	upstream := &atomic.Int64{}
	px := newTestProxy(t, engine, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstream.Add(1)
		w.WriteHeader(http.StatusTeapot)
	}))
	return px, upstream
}

func TestTopEndpoint(t *testing.T) {
	px, upstream := topTestProxy(t)
	for name, tc := range map[string]struct {
		token, path string
		code        int
		reason      metav1.StatusReason // for a Status answer
		report      string              // for a report: its budgets, as JSON
	}{
		"a caller allowed get watchbudgets/status reads the ranking by rejections": {
			token: "alice", path: topv1alpha1.Path, code: http.StatusOK,
			report: `[{"name":"agents","identities":[{"user":"greedy","rejections":2,"opens":1,"watches":1}]}]`},
		"sorted by opens, the first one": {
			token: "alice", path: topv1alpha1.Path + "?sort=opens&limit=1&budget=agents", code: http.StatusOK,
			report: `[{"name":"agents","identities":[{"user":"greedy","rejections":2,"opens":1,"watches":1}]}]`},
		"by open watches, ties by user": {
			token: "alice", path: topv1alpha1.Path + "?sort=watches", code: http.StatusOK,
			report: `[{"name":"agents","identities":[{"user":"greedy","rejections":2,"opens":1,"watches":1},{"user":"holder","rejections":0,"opens":1,"watches":1}]}]`},
		"a budget the replica does not know lists nothing": {
			token: "alice", path: topv1alpha1.Path + "?budget=other", code: http.StatusOK, report: `[]`},
		"no token is 401":                        {path: topv1alpha1.Path, code: http.StatusUnauthorized, reason: metav1.StatusReasonUnauthorized},
		"a bad token is 401":                     {token: "nobody", path: topv1alpha1.Path, code: http.StatusUnauthorized, reason: metav1.StatusReasonUnauthorized},
		"a caller without the permission is 403": {token: "agent", path: topv1alpha1.Path, code: http.StatusForbidden, reason: metav1.StatusReasonForbidden},
		"an unknown sort is 400":                 {token: "alice", path: topv1alpha1.Path + "?sort=names", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
		"a limit beyond MaxLimit is 400":         {token: "alice", path: topv1alpha1.Path + "?limit=101", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
		"a budget that is no name is 400":        {token: "alice", path: topv1alpha1.Path + "?budget=A%2FB", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
		"another path under the prefix is 404":   {token: "alice", path: "/.watchgate/v1alpha1/other", code: http.StatusNotFound, reason: metav1.StatusReasonNotFound},
		"the prefix alone is 404":                {token: "alice", path: "/.watchgate", code: http.StatusNotFound, reason: metav1.StatusReasonNotFound},
		"a spelling that cleans to the path is answered locally": {
			token: "alice", path: "//.watchgate/v1alpha1/../v1alpha1/top", code: http.StatusOK,
			report: `[{"name":"agents","identities":[{"user":"greedy","rejections":2,"opens":1,"watches":1}]}]`},
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := get(t, px, tc.token, tc.path)
			if resp.StatusCode != tc.code {
				t.Fatalf("GET %s: %d %s, want %d", tc.path, resp.StatusCode, body, tc.code)
			}
			if tc.report == "" {
				var st metav1.Status
				if err := json.Unmarshal(body, &st); err != nil || st.Kind != "Status" || st.Reason != tc.reason || st.Message == "" || strings.Contains(st.Message, `""`) {
					t.Fatalf("GET %s: body %s, want a Status with reason %s and a message (%v)", tc.path, body, tc.reason, err)
				}
				return
			}
			var rep topv1alpha1.TopReport
			if err := json.Unmarshal(body, &rep); err != nil {
				t.Fatalf("GET %s: %v in %s", tc.path, err, body)
			}
			if rep.Kind != topv1alpha1.Kind || rep.APIVersion != topv1alpha1.APIVersion || rep.Replica != "replica-0" {
				t.Errorf("GET %s: kind %q, apiVersion %q, replica %q", tc.path, rep.Kind, rep.APIVersion, rep.Replica)
			}
			got, _ := json.Marshal(rep.Budgets)
			if string(got) != tc.report {
				t.Errorf("GET %s: budgets\n%s\nwant\n%s", tc.path, got, tc.report)
			}
		})
	}
	if n := upstream.Load(); n != 0 {
		t.Errorf("%d requests for the top endpoint reached the upstream, want none", n)
	}
	// The same prefix deeper in a path is an API path, forwarded.
	if resp, _ := get(t, px, "alice", "/api/v1/namespaces/x/configmaps/.watchgate"); resp.StatusCode != http.StatusTeapot || upstream.Load() != 1 {
		t.Errorf("an API path with .watchgate in it: %d, upstream saw %d requests; want it forwarded", resp.StatusCode, upstream.Load())
	}
}

func TestTopEndpointRefusesOtherMethods(t *testing.T) {
	px, upstream := topTestProxy(t)
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		req, err := http.NewRequest(m, px.URL+topv1alpha1.Path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer alice")
		resp, err := px.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: %d, want 405", m, topv1alpha1.Path, resp.StatusCode)
		}
	}
	if n := upstream.Load(); n != 0 {
		t.Errorf("%d requests reached the upstream, want none", n)
	}
}
