package proxy

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	"github.com/watchgate/watchgate/internal/cputime"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/serve"
	"github.com/watchgate/watchgate/proxy/internal/upstreamtest"
)

var (
	idleWatches = flag.Int("idle-watches", 1000, "BenchmarkIdleWatches: watches held open per path")
	idleProfile = flag.String("idle-profiles", "", "BenchmarkIdleWatches: a directory to write each path's heap and goroutine profiles to while its watches are open")
)

// idleWatchConnections is how many HTTP/2 connections the benchmark's
// client spreads its watches over, as an agent with a few transports does.
const idleWatchConnections = 50

// BenchmarkIdleWatches holds -idle-watches idle watches (the upstream
// answers 200 and sends nothing) directly, through a bare
// httputil.ReverseProxy and through watchgate's chain, HTTP/2 over TLS on
// both hops, the client's watches spread over 50 connections, the upstream
// allowing 100 streams per connection as kube-apiserver does. Client,
// proxy and upstream share the process, so a proxy's own cost is its path
// less the direct path: proxy-heap-B/watch, proxy-stack-B/watch and
// proxy-goroutines/watch; the watches are opened all at once (a goroutine
// per connection), and proxy-cpu-µs/open is the proxy's CPU per open,
// upstream-conns the connections the upstream accepted meanwhile. The
// proxies keep their upstream connections between runs: only a process's
// first run (-count 1) opens its watches over connections it must dial,
// as a replica does when an agent restarts.
//
//	go test -run '^$' -bench BenchmarkIdleWatches -benchtime 1x -count 3 ./proxy/
//	go test -run '^$' -bench BenchmarkIdleWatches -benchtime 1x ./proxy/ -idle-watches 10000 -idle-profiles /tmp/idle
//
// -idle-profiles writes DIR/<path>.heap and DIR/<path>.goroutine while
// the watches are open (go tool pprof -sample_index=inuse_space).
func BenchmarkIdleWatches(b *testing.B) {
	n := *idleWatches
	if *idleProfile != "" {
		runtime.MemProfileRate = 4096 // every allocation of a watch's size
	}
	upstream, _, upstreamConns := upstreamtest.WatchUpstream(b, 100) // kube-apiserver's default

	var direct idleCost // the client's and upstream's share, subtracted from the proxies'
	for _, path := range benchPaths(b, upstream) {
		b.Run(path.name, func(b *testing.B) {
			srv := path.srv
			for b.Loop() {
				conns0 := upstreamConns.Load()
				cost := holdIdleWatches(b, srv, n, path.name)
				b.ReportMetric(float64(upstreamConns.Load()-conns0), "upstream-conns")
				if !path.proxied {
					direct = cost
				}
				b.ReportMetric(cost.heap, "heap-B/watch")
				b.ReportMetric(cost.goroutines, "goroutines/watch")
				b.ReportMetric(cost.openCPU, "cpu-µs/open")
				if path.proxied {
					b.ReportMetric(cost.heap-direct.heap, "proxy-heap-B/watch")
					b.ReportMetric(cost.stack-direct.stack, "proxy-stack-B/watch")
					b.ReportMetric(cost.goroutines-direct.goroutines, "proxy-goroutines/watch")
					b.ReportMetric(cost.openCPU-direct.openCPU, "proxy-cpu-µs/open")
				}
			}
		})
	}
}

// benchPath is one way to a benchmark's upstream: directly, or through a
// proxy served as watchgate serves (HTTP/2 over TLS, 1,000 streams per
// connection).
type benchPath struct {
	name    string
	srv     *httptest.Server
	proxied bool
}

// benchPaths are the direct path to upstream, a bare
// httputil.ReverseProxy in front of it and watchgate's chain (with
// serveHTTP2) in front of it.
func benchPaths(b *testing.B, upstream *httptest.Server) []benchPath {
	target, _ := url.Parse(upstream.URL)
	bare := bareReverseProxy(target)
	bareTransport := upstream.Client().Transport.(*http.Transport).Clone()
	bareTransport.ForceAttemptHTTP2 = true
	bare.Transport = bareTransport
	paths := []benchPath{{name: "direct", srv: upstream}}
	for _, p := range []struct {
		name    string
		handler http.Handler
		serve   func(*http.Server, http.Handler) error
	}{{"bare", bare, nil}, {"watchgate", newTestProxyTo(b, &enginetest.Engine{}, upstreamtest.Trusting(upstream)).Config.Handler, serve.HTTP2}} {
		srv := httptest.NewUnstartedServer(p.handler)
		srv.EnableHTTP2 = true
		srv.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1000}
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		if p.serve != nil {
			if err := p.serve(srv.Config, p.handler); err != nil {
				b.Fatal(err)
			}
		}
		srv.StartTLS()
		b.Cleanup(srv.Close)
		paths = append(paths, benchPath{name: p.name, srv: srv, proxied: true})
	}
	return paths
}

// idleCost is what the process holds per open watch, and the CPU it
// spent per watch opening them all at once (µs).
type idleCost struct{ heap, stack, goroutines, openCPU float64 }

// holdIdleWatches opens n watches to srv over idleWatchConnections HTTP/2
// connections, measures the process with them open, and closes them.
func holdIdleWatches(b *testing.B, srv *httptest.Server, n int, name string) idleCost {
	start := runtime.NumGoroutine()
	clients := make([]*http.Client, idleWatchConnections)
	for i := range clients {
		t := srv.Client().Transport.(*http.Transport).Clone()
		t.ForceAttemptHTTP2 = true
		clients[i] = &http.Client{Transport: t}
	}
	// One connection per client first, so that the measurement holds the
	// same connections on every path.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(i int) io.Closer {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/api/v1/namespaces/n%d/configmaps?watch=true", srv.URL, i), nil)
		req.Header.Set("Authorization", "Bearer alice")
		resp, err := clients[i%len(clients)].Do(req)
		if err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("watch %d: status %d", i, resp.StatusCode)
		}
		return resp.Body
	}
	var warm []io.Closer
	for i := range clients {
		warm = append(warm, open(i))
	}
	var before, after runtime.MemStats
	// Twice: the first moves sync.Pools' contents to their victim caches,
	// the second frees them, so that the opens cannot reuse what an
	// earlier path left in a pool without it counting.
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()

	bodies := make([]io.Closer, n)
	cpu0 := cputime.Process()
	var wg sync.WaitGroup
	for w := range idleWatchConnections {
		wg.Go(func() {
			for i := w; i < n; i += idleWatchConnections {
				bodies[i] = open(i)
			}
		})
	}
	wg.Wait()
	openCPU := cputime.Process() - cpu0
	time.Sleep(100 * time.Millisecond) // the streams' last frames settle
	runtime.GC()
	runtime.ReadMemStats(&after)
	cost := idleCost{
		heap:       float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n),
		stack:      float64(int64(after.StackInuse)-int64(before.StackInuse)) / float64(n),
		goroutines: float64(runtime.NumGoroutine()-g0) / float64(n),
		openCPU:    float64(openCPU.Microseconds()) / float64(n),
	}
	if dir := *idleProfile; dir != "" {
		writeProfiles(b, dir, name)
	}
	for _, c := range append(bodies, warm...) {
		_ = c.Close()
	}
	for _, c := range clients {
		c.CloseIdleConnections()
	}
	// The streams and connections are torn down before the next path
	// measures, or their memory freed would count against it.
	for range 100 {
		if runtime.NumGoroutine() <= start {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return cost
}

func writeProfiles(b *testing.B, dir, name string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	for _, p := range []string{"heap", "goroutine"} {
		f, err := os.Create(filepath.Join(dir, name+"."+p))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.Lookup(p).WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
		_ = f.Close()
	}
}
