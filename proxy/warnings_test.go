package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/admit"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/ratelimit"
)

// The Warning header reaches the client on a DryRun allow, a 429 and a
// local stale answer, once per identity and budget within the interval,
// one identity's warning does not hold back another's, and a 429's is
// repeated on the next admitted request.
func TestWarningsReachTheClient(t *testing.T) {
	var decision atomic.Pointer[ratelimit.Decision]
	engine := &enginetest.Engine{DecideFunc: func(*ratelimit.Request) ratelimit.Decision { return *decision.Load() }}
	upstream := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":[]}`)
	})
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	px := newTestAdmission(t, &admit.Admission{Engine: engine, MaxDelay: 10 * time.Millisecond, Warnings: admit.NewWarningLimiter(time.Hour, 100)}, &rest.Config{Host: up.URL})
	get := func(token, query string) (int, []string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, px.URL+"/api/v1/namespaces/ns/configmaps"+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := px.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, warningTexts(t, resp.Header)
	}
	for i, step := range []struct {
		decision     ratelimit.Decision
		token, query string
		wantCode     int
		want         string // "" for none
	}{
		{ratelimit.Decision{Allowed: true, Budget: "b"}, "alice", "", 200, ""},
		{ratelimit.Decision{Allowed: true, DryRun: true, Reason: ratelimit.ReasonRateLimited, Budget: "dry"}, "alice", "", 200,
			`299 watchgate budget "dry" (DryRun) would have rejected this list: too many watch or list requests`},
		// Within the interval: alice is not warned again about "dry"...
		{ratelimit.Decision{Allowed: true, DryRun: true, Reason: ratelimit.ReasonRateLimited, Budget: "dry"}, "alice", "", 200, ""},
		// ...but the agent is.
		{ratelimit.Decision{Allowed: true, DryRun: true, Reason: ratelimit.ReasonRateLimited, Budget: "dry"}, "agent", "", 200,
			`299 watchgate budget "dry" (DryRun) would have rejected this list: too many watch or list requests`},
		{ratelimit.Decision{Reason: ratelimit.ReasonRateLimited, Budget: "strict", RetryAfter: 35 * time.Second}, "alice", "", 429,
			`299 watchgate budget "strict" rejected this list: too many watch or list requests; retry after 35s`},
		// client-go retries that 429 without showing it: the next admitted
		// request under that budget repeats it, once.
		{ratelimit.Decision{Allowed: true, Budget: "other"}, "alice", "", 200, ""},
		{ratelimit.Decision{Allowed: true, Budget: "strict"}, "alice", "", 200,
			`299 watchgate budget "strict" rejected an earlier list: too many watch or list requests; retried after 35s`},
		{ratelimit.Decision{Allowed: true, Budget: "strict"}, "alice", "", 200, ""},
		{ratelimit.Decision{Reason: ratelimit.ReasonStaleResourceVersion, Budget: "stale"}, "alice", "?watch=true&resourceVersion=5", 200,
			`299 watchgate budget "stale" answered this watch with 410 Expired: resubscribing with a resourceVersion the API server declared too old; list again, then watch from the list's resourceVersion`},
	} {
		decision.Store(&step.decision)
		code, got := get(step.token, step.query)
		if code != step.wantCode {
			t.Errorf("step %d: HTTP %d, want %d", i, code, step.wantCode)
		}
		checkWarning(t, i, got, step.want)
	}
}

// A watch the replica's guard refused carries a Warning naming the reason
// and the flag that set the limit, once per caller within the interval;
// the caller's next watch the guard admits repeats it, once, since
// client-go retries the refusal without showing it.
func TestGuardRefusalsWarnTheClient(t *testing.T) {
	var inUse atomic.Uint64
	inUse.Store(90 * mib)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	release := make(chan struct{})
	defer close(release)
	g := guard.New(2, 1, 85, func() (uint64, uint64) { return inUse.Load(), 100 * mib }, clk)
	px := newTestAdmission(t, &admit.Admission{Engine: &enginetest.Engine{}, MaxDelay: 10 * time.Millisecond, Guard: g, Warnings: admit.NewWarningLimiter(time.Hour, 100)},
		guardedUpstream(t, release))
	watch := func(token string) (int, []string) {
		t.Helper()
		resp, _ := get(t, px, token, "/api/v1/namespaces/a/configmaps?watch=true")
		return resp.StatusCode, warningTexts(t, resp.Header)
	}
	for i, step := range []struct {
		// before runs ahead of the step's watch.
		before   func()
		token    string
		wantCode int
		want     string // "" for none
	}{
		{nil, "alice", 503,
			"299 watchgate refused this watch on this replica (MemoryHighWater: 90 of 100 MiB in use, above --memory-high-water-percent=85); retry after 5s"},
		// client-go retries it once memory went down: the admitted watch
		// repeats the warning, once.
		{func() { inUse.Store(10 * mib); clk.SetTime(clk.Now().Add(time.Second)) }, "alice", 200,
			"299 watchgate refused an earlier watch on this replica (MemoryHighWater: memory in use above --memory-high-water-percent=85); retried after 5s"},
		{nil, "alice", 200, ""},
		// Another caller is warned on its own.
		{func() {
			holdPath(t, px, "agent", "/api/v1/namespaces/a/pods?watch=true&resourceVersion=5")
			waitFor(t, "the agent's watch", func() bool { return g.OpenCount() == 1 })
		}, "agent", 429,
			"299 watchgate refused this watch on this replica (MaxWatchesPerIdentity: you hold --max-watches-per-identity=1 watches); retry after 5s"},
		{nil, "agent", 429, ""},
		// Within the interval alice is not warned again, whatever the
		// reason.
		{func() {
			holdPath(t, px, "alice", "/apis/two.example/v1/things?watch=true&resourceVersion=5")
			waitFor(t, "two watches", func() bool { return g.OpenCount() == 2 })
		}, "alice", 429, ""},
	} {
		if step.before != nil {
			step.before()
		}
		code, got := watch(step.token)
		if code != step.wantCode {
			t.Errorf("step %d: HTTP %d, want %d", i, code, step.wantCode)
		}
		checkWarning(t, i, got, step.want)
	}
}

// warningTexts reads the Warning headers of h as "code text" lines.
func warningTexts(t *testing.T, h http.Header) []string {
	t.Helper()
	parsed, errs := utilnet.ParseWarningHeaders(h["Warning"])
	if len(errs) > 0 {
		t.Errorf("Warning headers %q do not parse: %v", h["Warning"], errs)
	}
	var texts []string
	for _, p := range parsed {
		texts = append(texts, fmt.Sprintf("%d %s", p.Code, p.Text))
	}
	return texts
}

// checkWarning fails t unless step's answer carried exactly the warning
// want ("" for none).
func checkWarning(t *testing.T, step int, got []string, want string) {
	t.Helper()
	var wants []string
	if want != "" {
		wants = []string{want}
	}
	if strings.Join(got, "\n") != strings.Join(wants, "\n") {
		t.Errorf("step %d: warnings %q, want %q", step, got, wants)
	}
}

const mib = 1 << 20
