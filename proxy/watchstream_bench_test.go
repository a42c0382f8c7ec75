package proxy

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
	"github.com/watchgate/watchgate/proxy/internal/upstreamtest"
)

// BenchmarkWatchThroughProxy serves a 3,000-event JSON watch from an
// httptest upstream through a bare httputil.ReverseProxy (the floor) and
// through watchgate's whole chain (an engine that allows everything), and
// reports events/s as the client reads them. watchgate-h2 is watchgate in
// front of an upstream speaking HTTP/2 over TLS, as kube-apiserver does:
// the watch goes over watchgate's own HTTP/2 client (watchclient.go).
//
//	go test -run '^$' -bench BenchmarkWatchThroughProxy -benchmem ./proxy/
func BenchmarkWatchThroughProxy(b *testing.B) {
	stream := streamtest.BenchEvents(3000)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for rest := stream; len(rest) > 0; {
			n := min(len(rest), 16<<10)
			_, _ = w.Write(rest[:n])
			rest = rest[n:]
		}
	}))
	b.Cleanup(upstream.Close)
	upstreamH2 := httptest.NewUnstartedServer(upstream.Config.Handler)
	upstreamH2.EnableHTTP2 = true
	upstreamH2.StartTLS()
	b.Cleanup(upstreamH2.Close)
	target, _ := url.Parse(upstream.URL)
	bare := httptest.NewServer(bareReverseProxy(target))
	b.Cleanup(bare.Close)
	for _, via := range []struct {
		name string
		url  string
	}{
		{"bare", bare.URL},
		{"watchgate", newTestProxyTo(b, &enginetest.Engine{}, upstreamConfig(upstream.URL)).URL},
		{"watchgate-h2", newTestProxyTo(b, &enginetest.Engine{}, upstreamtest.Trusting(upstreamH2)).URL},
	} {
		b.Run(via.name, func(b *testing.B) {
			client := &http.Client{}
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodGet, via.url+"/api/v1/namespaces/bench/configmaps?watch=true", nil)
				req.Header.Set("Authorization", "Bearer alice")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if n != int64(len(stream)) {
					b.Fatalf("read %d bytes, want %d", n, len(stream))
				}
			}
			b.ReportMetric(3000*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func upstreamConfig(host string) *rest.Config { return &rest.Config{Host: host} }

// bareReverseProxy is the floor the benchmarks compare watchgate with: a
// plain httputil.ReverseProxy to target, flushed on every write.
func bareReverseProxy(target *url.URL) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	}
}

// BenchmarkIdleWatchMemory opens 200 idle watches (the upstream holds them
// open and sends nothing) through a bare httputil.ReverseProxy and through
// watchgate's chain, in process over HTTP/1.1, and reports goroutines,
// heap and stack bytes in use per open watch (client, proxy and upstream
// together).
//
//	go test -run '^$' -bench BenchmarkIdleWatchMemory -benchtime 1x -count 3 ./proxy/
func BenchmarkIdleWatchMemory(b *testing.B) {
	const watches = 200
	hold := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}))
	b.Cleanup(upstream.Close)
	b.Cleanup(func() { close(hold) })
	target, _ := url.Parse(upstream.URL)
	bare := httptest.NewServer(bareReverseProxy(target))
	b.Cleanup(bare.Close)
	for _, via := range []struct {
		name string
		url  string
	}{{"bare", bare.URL}, {"watchgate", newTestProxyTo(b, &enginetest.Engine{}, upstreamConfig(upstream.URL)).URL}} {
		b.Run(via.name, func(b *testing.B) {
			for b.Loop() {
				client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: watches}}
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				g0 := runtime.NumGoroutine()
				var bodies []io.Closer
				for i := range watches {
					req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/api/v1/namespaces/n%d/configmaps?watch=true", via.url, i), nil)
					req.Header.Set("Authorization", "Bearer alice")
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					bodies = append(bodies, resp.Body)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(runtime.NumGoroutine()-g0)/watches, "goroutines/watch")
				b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/watches, "heap-B/watch")
				b.ReportMetric(float64(int64(after.StackInuse)-int64(before.StackInuse))/watches, "stack-B/watch")
				for _, c := range bodies {
					_ = c.Close()
				}
				client.CloseIdleConnections()
			}
		})
	}
}
