package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// Hierarchical budgets through the real proxy in front of the real API
// server: an impersonating agent that invents 200 user names, each a fresh
// identity with fresh buckets, holds no more watches open than its
// aggregate allows; a second impersonator is unaffected.
func TestMadeUpImpersonatedNamesCannotMultiplyWhatACallerOpens(t *testing.T) {
	ns := uniqueName("aggregate")
	greedy := serviceAccount(t, ns, "greedy", readWatch("configmaps"), impersonateUsers)
	other := serviceAccount(t, ns, "other", readWatch("configmaps"), impersonateUsers)
	everyoneReadsConfigMaps(t, ns)
	const aggregate = 5
	agents := generous("agents-"+ns, 10)
	agents.Impersonation = ratelimit.DirectOnly
	agents.Subjects = []ratelimit.Subject{{Kind: ratelimit.ServiceAccount, Namespace: ns, Name: "*"}}
	agents.Aggregate = ratelimit.Aggregate{MaxConcurrentWatches: aggregate}
	people := generous("people-"+ns, 20)
	people.Impersonation = ratelimit.ImpersonatedOnly
	// Rejections are answered at once and reviews are not throttled, so
	// that 200 tries, each a fresh name to check, take no time.
	p := startProxyWith(t, func(o *proxy.Options) {
		o.MaxRejectDelay = time.Millisecond
		o.ReviewBurst, o.ImpersonationReviewCallerBurst = 1000, 1000
	}, agents, people)
	c := p.clientFrom("127.0.0.1")
	defer c.CloseIdleConnections()

	path := "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=60"
	var open []io.Closer
	defer func() {
		for _, b := range open {
			_ = b.Close()
		}
	}()
	// watch opens a watch as caller impersonating user; an admitted one is
	// kept open until the test ends.
	watch := func(caller, user string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, p.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+caller)
		req.Header.Set("Impersonate-User", user)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("watch as %s: %v", user, err)
		}
		if resp.StatusCode == http.StatusOK {
			open = append(open, resp.Body)
		} else {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
		}
		return resp.StatusCode, resp.Header.Get(proxy.DecisionHeader)
	}

	served, limited := 0, 0
	for i := range 200 {
		code, decision := watch(greedy.Token, fmt.Sprintf("made-up-%s-%d", ns, i))
		switch {
		case code == http.StatusOK:
			served++
		case code == http.StatusTooManyRequests && strings.Contains(decision, "reason="+string(ratelimit.ReasonAggregateLimited)) &&
			strings.Contains(decision, "budget="+agents.Name):
			limited++
		default:
			t.Fatalf("made-up user %d: HTTP %d %q, want 200 or 429 AggregateLimited by %s", i, code, decision, agents.Name)
		}
	}
	if served != aggregate || limited != 200-aggregate {
		t.Errorf("200 made-up names: %d watches served, %d limited; want %d and %d", served, limited, aggregate, 200-aggregate)
	}
	for i := range aggregate {
		if code, decision := watch(other.Token, fmt.Sprintf("someone-%s-%d", ns, i)); code != http.StatusOK {
			t.Errorf("the other impersonator's watch %d: HTTP %d %q, want 200", i, code, decision)
		}
	}
	// The greedy caller's own watches are its own budget's: not limited by
	// what it opens for others.
	if code, decision, err := send(c, p.URL, greedy.Token, "/api/v1/namespaces/"+ns+"/configmaps?watch=true&timeoutSeconds=1"); err != nil || code != http.StatusOK {
		t.Errorf("the greedy caller in its own name: HTTP %d %q %v, want 200", code, decision, err)
	}
	// One of its watches ends: it may open one more for someone.
	_ = open[0].Close()
	open = open[1:]
	eventually(t, 10*time.Second, "a freed aggregate slot", func() (bool, error) {
		code, _ := watch(greedy.Token, "made-up-after-"+ns)
		return code == http.StatusOK, nil
	})
}
