package proxy

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/admit"
	"github.com/watchgate/watchgate/proxy/internal/callertest"
	"github.com/watchgate/watchgate/proxy/internal/coalesce"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/relay"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/proxy/internal/top"
	"github.com/watchgate/watchgate/proxy/internal/upstream"
	"github.com/watchgate/watchgate/ratelimit"
)

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
	return newTestAdmission(t, &admit.Admission{Engine: engine, MaxDelay: 50 * time.Millisecond}, upstream)
}

// newTestAdmission serves the whole chain in front of the API server apiserver with adm,
// whose engine, maxDelay and guard the caller sets; the rest is filled in.
func newTestAdmission(t testing.TB, adm *admit.Admission, apiserver *rest.Config) *httptest.Server {
	t.Helper()
	target, transport, err := upstream.NewTransport(apiserver, &upstream.ConnectionCount{}, relay.ForwardedWatch)
	if err != nil {
		t.Fatal(err)
	}
	logs := logtest.Discard()
	adm.Clock, adm.Watches, adm.Log, adm.DelaySlots = clock.RealClock{}, relay.NewOpenWatches(), logs, admit.NewDelaySlots(8)
	adm.Coalescer, adm.QuietWindow, adm.FollowerWait = coalesce.New(), coalesce.LeaderQuietWindow, coalesce.FollowerWait
	topEndpoint := top.NewEndpoint(adm.Engine, callertest.Access, "replica-0", clock.RealClock{}, logs)
	topEndpoint.Reads = ratelimit.NewKeyRate(1e9, 1<<20, 16)
	h := chain(callertest.Tokens, callertest.Impersonation, review.FailClosed, adm, topEndpoint, logs, upstream.NewReverseProxy(target, transport, log.New(io.Discard, "", 0), logs, relay.ForwardedWatch))
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
