package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/watchgate/watchgate/proxy/internal/coalesce"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/metricstest"
)

// BenchmarkWatchOpen opens a watch from an explicit resourceVersion and
// closes it as soon as the headers arrive, through a bare
// httputil.ReverseProxy (the floor) and through watchgate's whole chain
// (an engine that admits everything), in process: the client speaks
// HTTP/2 over TLS to the proxy, the proxy HTTP/1.1 to an httptest upstream
// that answers 200 and holds the stream until the client leaves. B/op and
// allocs/op are the whole process's (client, proxy and upstream), so the
// difference between the two is the proxy's.
//
//	go test -run '^$' -bench BenchmarkWatchOpen -benchmem -count 5 ./proxy/
func BenchmarkWatchOpen(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	b.Cleanup(upstream.Close)
	target, _ := url.Parse(upstream.URL)
	bare := bareReverseProxy(target)
	for _, via := range []struct {
		name    string
		handler http.Handler
	}{{"bare", bare}, {"watchgate", newTestProxyTo(b, &enginetest.Engine{}, upstreamConfig(upstream.URL)).Config.Handler}} {
		b.Run(via.name, func(b *testing.B) {
			px := httptest.NewUnstartedServer(via.handler)
			px.EnableHTTP2 = true
			px.StartTLS()
			b.Cleanup(px.Close)
			client := px.Client()
			open := func() {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, px.URL+"/api/v1/namespaces/bench/configmaps?watch=true&resourceVersion=42", nil)
				req.Header.Set("Authorization", "Bearer alice")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
				_ = resp.Body.Close()
			}
			open() // the connection
			held := metricstest.CounterValue(b, coalesce.WatchesCoalesced)
			b.ReportAllocs()
			for b.Loop() {
				open()
			}
			// Opens that waited for the previous open's verdict.
			b.ReportMetric((metricstest.CounterValue(b, coalesce.WatchesCoalesced)-held)/float64(b.N), "held/op")
		})
	}
}
