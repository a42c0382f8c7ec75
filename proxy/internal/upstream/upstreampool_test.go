package upstream

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/watchgate/watchgate/proxy/internal/upstreamtest"
)

// A burst of watches opened at once over connections that carry 10
// streams each dials one connection per 10 watches, not one per watch
// that found the connections full, and every watch is served.
func TestUpstreamPoolDialsOneConnectionAtATime(t *testing.T) {
	const watches, streams = 60, 10
	up, cfg, accepted := upstreamtest.WatchUpstream(t, streams)
	conns := &ConnectionCount{}
	rt := testPool(t, cfg, conns)
	// The first connection, so that its SETTINGS (10 streams) are known.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(i int) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/api/v1/namespaces/n%d/configmaps?watch=true", up.URL, i), nil)
		return rt.RoundTrip(req)
	}
	first, err := open(-1)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()

	bodies := upstreamtest.OpenAtOnce(t, watches, open)
	for _, b := range bodies {
		defer b.Close()
	}
	// 61 streams need 7 connections of 10.
	if got := accepted.Load(); got != (watches+1+streams-1)/streams {
		t.Errorf("the upstream accepted %d connections for %d streams of at most %d each", got, watches+1, streams)
	}
	if got := conns.Open.Load(); got != (watches+1+streams-1)/streams {
		t.Errorf("%d connections counted open", got)
	}
}

func TestCanonicalAddr(t *testing.T) {
	for in, want := range map[[2]string]string{
		{"https", "api.example:6443"}: "api.example:6443",
		{"https", "api.example"}:      "api.example:443",
		{"http", "127.0.0.1"}:         "127.0.0.1:80",
		{"https", "[::1]"}:            "[::1]:443",
		{"https", "[::1]:6443"}:       "[::1]:6443",
	} {
		if got := canonicalAddr(in[0], in[1]); got != want {
			t.Errorf("canonicalAddr(%q, %q) = %q, want %q", in[0], in[1], got, want)
		}
	}
}

// A connection with nothing in flight is closed once it has been idle for
// the transport's IdleConnTimeout; until then the next request reuses it.
func TestUpstreamPoolClosesIdleConnections(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	up.EnableHTTP2 = true
	var accepted atomic.Int64
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	up.StartTLS()
	t.Cleanup(up.Close)
	pool := testPool(t, upstreamtest.Trusting(up), &ConnectionCount{})
	t0 := time.Now()
	now := t0
	pool.now = func() time.Time { return now }
	get := func() {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, up.URL+"/version", nil)
		resp, err := pool.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	for i, step := range []struct {
		at   time.Duration
		want int64 // connections accepted so far
	}{
		{0, 1},
		{upstreamPruneInterval, 1},             // idle, not for long
		{upstreamPruneInterval + pool.idle, 1}, // idle exactly IdleConnTimeout: kept
		{2*upstreamPruneInterval + 2*pool.idle + time.Second, 2}, // idle longer: closed, a new one
	} {
		now = t0.Add(step.at)
		get()
		if got := accepted.Load(); got != step.want {
			t.Errorf("step %d (+%v): %d connections accepted, want %d", i, step.at, got, step.want)
		}
	}
}

// Over HTTP/1.1 a watch the client leaves closes its connection. The
// pool drops such a connection when a request's search meets it, so that
// the search does not grow with every watch closed since the last prune.
func TestUpstreamPoolDropsBrokenConnectionsAsItSearches(t *testing.T) {
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { // HTTP/1.1 only
		if r.ProtoMajor != 1 {
			t.Errorf("the upstream got %s, want HTTP/1.1", r.Proto)
		}
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(up.Close)
	pool := testPool(t, upstreamtest.Trusting(up), &ConnectionCount{})
	now := time.Now()
	pool.now = func() time.Time { return now } // no prune in this test
	const watches = 50
	for range watches {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, up.URL+"/api/v1/configmaps?watch=true", nil)
		resp, err := pool.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		_ = resp.Body.Close()
	}
	pool.mu.Lock()
	held := len(pool.conns["https://"+canonicalAddr("https", strings.TrimPrefix(up.URL, "https://"))])
	pool.mu.Unlock()
	if held > watches/5 {
		t.Errorf("the pool holds %d connections after %d watches opened and left one after the other, want the broken ones dropped", held, watches)
	}
}

// testPool is the pool of a forwarder to cfg, its connections closed when
// the test ends.
func testPool(t *testing.T, cfg *rest.Config, conns *ConnectionCount) *upstreamPool {
	t.Helper()
	_, transport, err := NewTransport(cfg, conns, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := transport.(Transport).normal.(*upstreamPool)
	t.Cleanup(pool.CloseIdleConnections)
	return pool
}
