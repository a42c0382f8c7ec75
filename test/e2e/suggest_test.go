package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// Real watches through the proxy in front of the real API server, by an
// agent impersonating 22 users under a DryRun budget: 20 open 5 watches
// each and 2 open 60 each, in one calendar minute. The engine observes
// every identity, and the suggestion for a 90% share with 150% headroom is
// the quiet users' 5 opens a minute times 1.5; the current limits (20 a
// minute, burst 30: at most 50 opens in a minute) would have refused the 2
// loud users. The controllers' tests carry the same figures into
// status.suggested.
func TestSuggestedLimitsFromRealWatches(t *testing.T) {
	ns := uniqueName("suggest")
	agent := serviceAccount(t, ns, "agent", readWatch("configmaps"), impersonateUsers)
	everyoneReadsConfigMaps(t, ns)
	agents := generous("agents-"+ns, 10)
	agents.Impersonation = ratelimit.DirectOnly
	agents.Subjects = []ratelimit.Subject{{Kind: ratelimit.ServiceAccount, Namespace: ns, Name: "*"}}
	people := ratelimit.Budget{
		Name: "people-" + ns, Precedence: 20, Enforcement: ratelimit.DryRun, Impersonation: ratelimit.ImpersonatedOnly,
		Limits:     ratelimit.Limits{WatchOpensPerMinute: 20, WatchBurst: 30, InitialStateCost: 1},
		Suggestion: ratelimit.Suggestion{Share: 90, HeadroomPercent: 150},
	}
	p := startProxyWith(t, func(o *proxy.Options) {
		o.ReviewBurst, o.ImpersonationReviewCallerBurst = 1000, 1000
	}, agents, people)
	c := p.clientFrom("127.0.0.1")
	defer c.CloseIdleConnections()

	path := "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=30"
	open := func(user string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, p.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+agent.Token)
		req.Header.Set("Impersonate-User", user)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("watch as %s: %v", user, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("watch as %s: HTTP %d %q, want 200 (DryRun admits)", user, resp.StatusCode, resp.Header.Get(proxy.DecisionHeader))
		}
	}
	// drive opens n watches as user within one calendar minute: it starts
	// in the next minute when fewer than 15 s of this one are left.
	drive := func(user string, n int) {
		t.Helper()
		if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 15*time.Second {
			time.Sleep(left)
		}
		minute := time.Now().Truncate(time.Minute)
		for range n {
			open(user)
		}
		if now := time.Now().Truncate(time.Minute); !now.Equal(minute) {
			t.Fatalf("%s's %d watches spread over two calendar minutes (%s and %s): the machine is too slow for this test", user, n, minute, now)
		}
	}
	for u := range 20 {
		drive(fmt.Sprintf("quiet-%s-%d", ns, u), 5)
	}
	for u := range 2 {
		drive(fmt.Sprintf("loud-%s-%d", ns, u), 60)
	}

	observed := p.Engine.Stats()[people.Name].Observed
	if observed.Identities != 22 {
		t.Fatalf("%d identities observed, want 22", observed.Identities)
	}
	for q, want := range map[int32]int32{50: 5, 90: 5, 100: 63} {
		if got := observed.WatchOpensPerMinute.Quantile(q); got != want {
			t.Errorf("opens a minute, %d%% quantile: %d, want %d", q, got, want)
		}
	}
	got := ratelimit.Suggest(&observed, people.Limits, people.Suggestion)
	if got.WatchOpensPerMinute != 8 || got.WouldRefuse != 2 || got.Identities != 22 {
		t.Errorf("suggested %+v, want 8 opens a minute, 2 refused, 22 identities", got)
	}
	// The 5 quiet opens come within a second or two, and a watch's end
	// reaches the engine a moment after the client closed it: bursts and
	// concurrency are bounded, not exact.
	if got.WatchBurst < 2 || got.WatchBurst > 8 || got.MaxConcurrentWatches < 2 || got.MaxConcurrentWatches > 8 {
		t.Errorf("suggested burst %d and %d watches at once, want each between 2 and 8 (1 to 5 observed, ×1.5)", got.WatchBurst, got.MaxConcurrentWatches)
	}
}
