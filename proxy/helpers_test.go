package proxy

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/callertest"
	"github.com/watchgate/watchgate/proxy/internal/coalesce"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/proxy/internal/top"
	"github.com/watchgate/watchgate/proxy/internal/upstream"
	"github.com/watchgate/watchgate/ratelimit"
)

// fakeEngine decides with decide (allow everything when nil) and records
// what the proxy told it.
type fakeEngine struct {
	decide func(*ratelimit.Request) ratelimit.Decision

	mu       sync.Mutex
	requests []ratelimit.Request
	ended    []ratelimit.Outcome
	stale    []string // "group/resource@rv"
}

func (e *fakeEngine) Decide(_ time.Time, r *ratelimit.Request) ratelimit.Decision {
	e.mu.Lock()
	e.requests = append(e.requests, *r)
	e.mu.Unlock()
	if e.decide == nil {
		return ratelimit.Decision{Allowed: true}
	}
	return e.decide(r)
}

func (e *fakeEngine) WatchEnded(_ time.Time, _ ratelimit.Watch, _ time.Duration, o ratelimit.Outcome) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ended = append(e.ended, o)
}

func (e *fakeEngine) StaleVersionSeen(_ time.Time, group, resource, rv string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stale = append(e.stale, group+"/"+resource+"@"+rv)
}

func (e *fakeEngine) Sweep(time.Time) int { return 0 }

func (e *fakeEngine) snapshot() (requests []ratelimit.Request, ended []ratelimit.Outcome, stale []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.requests), slices.Clone(e.ended), slices.Clone(e.stale)
}

// waitEnded waits (at most 5s) until n watches ended and returns their outcomes.
func (e *fakeEngine) waitEnded(t *testing.T, n int) []ratelimit.Outcome {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, ended, _ := e.snapshot()
		if len(ended) >= n || time.Now().After(deadline) {
			return ended
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// newTestProxy serves the whole chain, with testTokens and
// testImpersonation, in front of upstream (a plain HTTP server).
func newTestProxy(t testing.TB, engine Engine, upstream http.Handler) *httptest.Server {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	return newTestProxyTo(t, engine, &rest.Config{Host: up.URL})
}

func newTestProxyTo(t testing.TB, engine Engine, upstream *rest.Config) *httptest.Server {
	t.Helper()
	return newTestAdmission(t, &admission{engine: engine, maxDelay: 50 * time.Millisecond}, upstream)
}

// newTestAdmission serves the whole chain in front of the API server apiserver with adm,
// whose engine, maxDelay and guard the caller sets; the rest is filled in.
func newTestAdmission(t testing.TB, adm *admission, apiserver *rest.Config) *httptest.Server {
	t.Helper()
	target, transport, err := upstream.NewTransport(apiserver, &upstream.ConnectionCount{}, forwardedWatch)
	if err != nil {
		t.Fatal(err)
	}
	logs := logtest.Discard()
	adm.clock, adm.watches, adm.log, adm.delaySlots = clock.RealClock{}, newOpenWatches(), logs, make(chan struct{}, 8)
	adm.coalescer, adm.quietWindow, adm.followerWait = coalesce.New(), coalesce.LeaderQuietWindow, coalesce.FollowerWait
	topEndpoint := top.NewEndpoint(adm.engine, callertest.Access, "replica-0", clock.RealClock{}, logs)
	topEndpoint.Reads = ratelimit.NewKeyRate(1e9, 1<<20, 16)
	h := chain(callertest.Tokens, callertest.Impersonation, review.FailClosed, adm, topEndpoint, logs, upstream.NewReverseProxy(target, transport, log.New(io.Discard, "", 0), logs, forwardedWatch))
	px := httptest.NewServer(h)
	t.Cleanup(px.Close)
	return px
}

// get sends GET path to srv with the token (none when empty) and headers.
func get(t *testing.T, srv *httptest.Server, token, path string, headers ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body of %s: %v", path, err)
	}
	return resp, body
}

func schemaGR(group, resource string) schema.GroupResource {
	return schema.GroupResource{Group: group, Resource: resource}
}
