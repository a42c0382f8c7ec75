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

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/ratelimit"
)

func TestWarningLimiterTimeline(t *testing.T) {
	const interval = time.Minute
	l := newWarningLimiter(interval, 3)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for i, step := range []struct {
		at           time.Time
		user, budget string
		want         bool
		remembered   int
	}{
		{at(0), "alice", "b1", true, 1},
		{at(time.Second), "alice", "b1", false, 1},
		// Another budget, another identity: warned on their own.
		{at(2 * time.Second), "alice", "b2", true, 2},
		{at(3 * time.Second), "bob", "b1", true, 3},
		{at(59 * time.Second), "alice", "b1", false, 3},
		// A minute after alice's first warning about b1 she is warned again;
		// her first pair was idle and forgotten, then remembered anew.
		{at(interval), "alice", "b1", true, 3},
		// Full: carol pushes out the least recently warned (alice/b2), so
		// alice/b2 is warned again early, nobody is held back.
		{at(interval + time.Second), "carol", "b1", true, 3},
		{at(interval + 2*time.Second), "alice", "b2", true, 3},
		{at(interval + 3*time.Second), "carol", "b1", false, 3},
		{at(interval + 4*time.Second), "bob", "b1", true, 3}, // pushed out by alice/b2
		// Names that differ only in where budget ends and user begins
		// are different pairs.
		{at(interval + 5*time.Second), "1", "b", true, 3},
		{at(interval + 6*time.Second), "", "b1", true, 3},
		// Everyone idle: all forgotten.
		{at(10 * interval), "dave", "b1", true, 1},
	} {
		if got := l.allow(step.at, step.user, step.budget, nil); got != step.want {
			t.Errorf("step %d (%s about %s at +%s): allow = %v, want %v", i, step.user, step.budget, step.at.Sub(t0), got, step.want)
		}
		if got := l.len(); got != step.remembered {
			t.Errorf("step %d: %d pairs remembered, want %d", i, got, step.remembered)
		}
	}
}

func TestWarningLimiterStaysBounded(t *testing.T) {
	l := newWarningLimiter(time.Hour, 100)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10000 {
		if !l.allow(now, fmt.Sprintf("user-%d-%s", i, strings.Repeat("x", 1000)), "b", &rejection{}) {
			t.Fatalf("user %d, never warned before, was held back", i)
		}
	}
	if got := l.len(); got != 100 {
		t.Errorf("%d pairs remembered, want the bound 100", got)
	}
	if got := l.owing.Load(); got != 100 {
		t.Errorf("%d pairs owe a repeat, want 100 (those remembered)", got)
	}
}

func TestWarningLimiterOwesARetriedRejectionOnce(t *testing.T) {
	l := newWarningLimiter(time.Minute, 10)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &rejection{verb: ratelimit.VerbList, reason: ratelimit.ReasonRateLimited, retryAfterSeconds: 35}
	if _, ok := l.owed("alice", "b"); ok {
		t.Fatal("owed before any warning")
	}
	if !l.allow(t0, "alice", "b", r) {
		t.Fatal("first warning held back")
	}
	if _, ok := l.owed("bob", "b"); ok {
		t.Error("bob owed alice's rejection")
	}
	if _, ok := l.owed("alice", "other"); ok {
		t.Error("alice owed a rejection under another budget")
	}
	if got, ok := l.owed("alice", "b"); !ok || got != *r {
		t.Errorf("owed = %+v, %v; want %+v", got, ok, *r)
	}
	if _, ok := l.owed("alice", "b"); ok {
		t.Error("owed twice")
	}
	// A 429 within the interval is not warned, so it owes nothing either.
	if l.allow(t0.Add(time.Second), "alice", "b", r) {
		t.Error("second warning within the interval")
	}
	if _, ok := l.owed("alice", "b"); ok {
		t.Error("owed a rejection that was not warned")
	}
	// Forgotten when idle.
	l.allow(t0.Add(2*time.Minute), "alice", "b", r)
	l.allow(t0.Add(4*time.Minute), "bob", "b", nil)
	if _, ok := l.owed("alice", "b"); ok || l.owing.Load() != 0 {
		t.Errorf("an idle pair's repeat kept (%d owing)", l.owing.Load())
	}
}

func TestWarningText(t *testing.T) {
	for name, tc := range map[string]struct {
		verb ratelimit.Verb
		d    ratelimit.Decision
		want string
	}{
		"a DryRun budget would have rejected a list": {
			verb: ratelimit.VerbList,
			d:    ratelimit.Decision{Allowed: true, DryRun: true, Reason: ratelimit.ReasonRateLimited, Budget: "catch-all", RetryAfter: time.Second},
			want: `watchgate budget "catch-all" (DryRun) would have rejected this list: too many watch or list requests`,
		},
		"an Enforce budget rejected a watch for 35 s": {
			verb: ratelimit.VerbWatch,
			d:    ratelimit.Decision{Reason: ratelimit.ReasonTooManyWatches, Budget: "team", RetryAfter: 34500 * time.Millisecond},
			want: `watchgate budget "team" rejected this watch: too many open watches; retry after 35s`,
		},
		"a stale watch answered locally": {
			verb: ratelimit.VerbWatch,
			d:    ratelimit.Decision{Reason: ratelimit.ReasonStaleResourceVersion, Budget: "team"},
			want: `watchgate budget "team" answered this watch with 410 Expired: resubscribing with a resourceVersion the API server declared too old; list again, then watch from the list's resourceVersion`,
		},
		"a budget name with a quote and a control character": {
			verb: ratelimit.VerbList,
			d:    ratelimit.Decision{Reason: ratelimit.ReasonRateLimited, Budget: "a\"b\x01", RetryAfter: time.Second},
			want: `watchgate budget "a\"b\x01" rejected this list: too many watch or list requests; retry after 1s`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := warningText(tc.verb, &tc.d)
			if got != tc.want {
				t.Errorf("warningText = %q, want %q", got, tc.want)
			}
			if _, err := utilnet.NewWarningHeader(299, "-", got); err != nil {
				t.Errorf("not a valid warning text: %v", err)
			}
		})
	}
}

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
	px := newTestAdmission(t, &admission{engine: engine, maxDelay: 10 * time.Millisecond, warnings: newWarningLimiter(time.Hour, 100)}, &rest.Config{Host: up.URL})
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
	px := newTestAdmission(t, &admission{engine: &enginetest.Engine{}, maxDelay: 10 * time.Millisecond, guard: g, warnings: newWarningLimiter(time.Hour, 100)},
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

func TestGuardRefusalText(t *testing.T) {
	g := guard.New(4000, 1000, 85, noMemory, clocktesting.NewFakePassiveClock(time.Now()))
	uncapped := guard.New(0, 0, 90, noMemory, clocktesting.NewFakePassiveClock(time.Now()))
	for name, tc := range map[string]struct {
		g      *guard.Guard
		reason string
		want   string
	}{
		"the replica's watch cap":  {g, guard.GuardMaxWatches, "it forwards --max-watches=4000 watches"},
		"the cap per identity":     {g, guard.GuardMaxWatchesPerIdentity, "you hold --max-watches-per-identity=1000 watches"},
		"fair share near the cap":  {g, guard.GuardFairShare, "near --max-watches=4000 or --memory-high-water-percent=85, you hold your fair share of the watches"},
		"fair share without a cap": {uncapped, guard.GuardFairShare, "near --memory-high-water-percent=90, you hold your fair share of the watches"},
		"memory, sample not known": {g, guard.GuardMemoryHighWater, "memory in use above --memory-high-water-percent=85"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := tc.g.RefusalText(tc.reason, nil); got != tc.want {
				t.Errorf("refusalText = %q, want %q", got, tc.want)
			}
		})
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
