package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watchgate/watchgate/proxy"
)

// heldWatch is a watch open through the proxy, its response's headers
// read and its body left open until close.
type heldWatch struct {
	code     int
	decision string
	close    func()
}

// hold opens GET path as token with header pairs and returns once the
// response's headers arrived; a refusal's body is read and closed at
// once, an admitted watch's stays open until close (or the test's end).
func hold(t testing.TB, c *http.Client, url, token, path string, headers ...string) heldWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		cancel()
		t.Errorf("GET %s: %v", path, err)
		return heldWatch{close: func() {}}
	}
	h := heldWatch{code: resp.StatusCode, decision: resp.Header.Get(proxy.DecisionHeader)}
	var once sync.Once
	h.close = func() {
		once.Do(func() {
			cancel()
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
		})
	}
	if resp.StatusCode != http.StatusOK {
		h.close()
	}
	t.Cleanup(h.close)
	return h
}

// mainDefaults sets the options main's flags default and proxy.Options
// leaves 0.
func mainDefaults(o *proxy.Options) {
	o.WatchOpensPerIdentityPerSecond = proxy.DefaultWatchOpensPerIdentityPerSecond
	o.WatchOpenBurstPerIdentity = proxy.DefaultWatchOpenBurstPerIdentity
	o.MaxWatchOpensInFlight = proxy.DefaultMaxWatchOpensInFlight
}

// longWatch is a path of a watch of ns's configmaps that the API server
// keeps open for the test's length.
func longWatch(ns string) string {
	return "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=300"
}

// A tenant mints service accounts for free: the accounts of one namespace
// together get one caller's share of the replica. Twelve of them, each
// trying to hold 4 watches of a replica of 40 (a caller's ceiling 10),
// hold at most 10 together, and another tenant's first watch gets in.
func TestServiceAccountsOfOneNamespaceShareOneCallersShare(t *testing.T) {
	swarmNS, otherNS := uniqueName("swarm"), uniqueName("tenant")
	everyoneReadsConfigMaps(t, swarmNS)
	everyoneReadsConfigMaps(t, otherNS)
	p := startProxyWith(t, func(o *proxy.Options) { o.MaxWatches = 40 }, generous("everyone", 100))
	c := p.clientFrom("127.0.0.1")
	defer c.CloseIdleConnections()

	held := 0
	refusals := map[string]int{}
	for i := range 12 {
		sa := serviceAccount(t, swarmNS, fmt.Sprintf("sa-%d", i))
		for range 4 {
			w := hold(t, c, p.URL, sa.Token, longWatch(swarmNS))
			if w.code == http.StatusOK {
				held++
			} else {
				refusals[w.decision]++
			}
		}
	}
	if held > 10 {
		t.Errorf("the namespace's 12 service accounts hold %d watches, want at most 10 (one caller's share); refusals %v", held, refusals)
	}
	other := serviceAccount(t, otherNS, "other")
	if w := hold(t, c, p.URL, other.Token, longWatch(otherNS)); w.code != http.StatusOK {
		t.Errorf("another tenant's first watch: HTTP %d %q, want 200 (the swarm holds %d, refusals %v)", w.code, w.decision, held, refusals)
	}
}

// The users behind an impersonating agent share the agent's places: one
// user holding all it can leaves room for the agent's next user.
func TestOneUserBehindAnAgentLeavesRoomForTheNext(t *testing.T) {
	ns := uniqueName("behind")
	everyoneReadsConfigMaps(t, ns)
	agent := serviceAccount(t, ns, "agent", impersonateUsers)
	p := startProxyWith(t, func(o *proxy.Options) { o.MaxWatches = 400 }, generous("everyone", 100)) // the agent's ceiling 100
	c := p.clientFrom("127.0.0.1")
	defer c.CloseIdleConnections()

	held := 0
	for range 100 {
		if w := hold(t, c, p.URL, agent.Token, longWatch(ns), "Impersonate-User", "first-"+ns); w.code == http.StatusOK {
			held++
		}
	}
	if held == 100 {
		t.Errorf("one user behind the agent holds all 100 of the agent's places")
	}
	if w := hold(t, c, p.URL, agent.Token, longWatch(ns), "Impersonate-User", "next-"+ns); w.code != http.StatusOK {
		t.Errorf("the agent's next user's first watch: HTTP %d %q, want 200 (the first user holds %d)", w.code, w.decision, held)
	}
}

// One user behind an agent opening watches as fast as it can does not use
// up the agent's opens: the agent's next user's 10 watches all open, with
// default flags.
func TestOneUserBehindAnAgentDoesNotSpendTheNextUsersOpens(t *testing.T) {
	ns := uniqueName("opens")
	everyoneReadsConfigMaps(t, ns)
	agent := serviceAccount(t, ns, "agent", impersonateUsers)
	p := startProxyWith(t, mainDefaults, generous("everyone", 100))
	c := p.clientFrom("127.0.0.1")
	defer c.CloseIdleConnections()

	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for range 20 {
				hold(t, c, p.URL, agent.Token, longWatch(ns), "Impersonate-User", "first-"+ns)
			}
		})
	}
	wg.Wait()
	opened := 0
	var refusals []string
	for range 10 {
		if w := hold(t, c, p.URL, agent.Token, longWatch(ns), "Impersonate-User", "next-"+ns); w.code == http.StatusOK {
			opened++
		} else {
			refusals = append(refusals, fmt.Sprintf("%d %q", w.code, w.decision))
		}
	}
	if opened != 10 {
		t.Errorf("the agent's next user opened %d of 10 watches, want 10; refused %v", opened, refusals)
	}
}

// An agent's restart: one caller opening 2,000 watches at once with
// default flags has them all, none refused.
func TestAnAgentsMassReopenIsServed(t *testing.T) {
	massReopen(t, 2000, 2*time.Minute)
}

// massReopen opens n watches as one agent from 100 goroutines with
// default flags, and fails unless every one is served within limit.
func massReopen(t *testing.T, n int, limit time.Duration) {
	ns := uniqueName("reopen")
	agent := serviceAccount(t, ns, "agent", readWatch("configmaps"))
	p := startProxyWith(t, mainDefaults, generous("everyone", 100))
	var opened, next atomic.Int64
	var mu sync.Mutex
	refusals := map[string]int{}
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 100 {
		c := p.clientFrom(fmt.Sprintf("127.0.%d.%d", 1+g/50, 1+g%50))
		defer c.CloseIdleConnections()
		wg.Go(func() {
			for next.Add(1) <= int64(n) && time.Since(start) < limit {
				w := hold(t, c, p.URL, agent.Token, longWatch(ns))
				if w.code == http.StatusOK {
					opened.Add(1)
					continue
				}
				mu.Lock()
				refusals[fmt.Sprintf("%d %s", w.code, strings.TrimSpace(w.decision))]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	t.Logf("%d of %d watches opened in %v; refused %v", opened.Load(), n, took.Round(time.Millisecond), refusals)
	if opened.Load() != int64(n) {
		t.Errorf("the agent opened %d of %d watches, want all; refused %v", opened.Load(), n, refusals)
	}
}
