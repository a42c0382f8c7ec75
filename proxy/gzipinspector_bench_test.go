package proxy

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/watchgate/watchgate/internal/cputime"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
)

// BenchmarkGzipWatchThroughProxy serves a 3,000-event JSON watch-list as
// kube-apiserver sends it to a client that accepts gzip (a gzip member per
// event, flushed; the members are encoded once, beforehand) from an
// httptest upstream through a bare httputil.ReverseProxy and through
// watchgate's whole chain, which inflates a copy to inspect it, and, for
// scale, the same events unencoded through watchgate (watchgate-identity).
// The client reads the encoded bytes. It reports wall and CPU time per event (client,
// proxy and upstream in one process: the difference between the two is
// the proxy's).
//
//	go test -run '^$' -bench BenchmarkGzipWatchThroughProxy -benchmem -count 5 ./proxy/
func BenchmarkGzipWatchThroughProxy(b *testing.B) {
	const events = 3000
	plain := streamtest.BenchEvents(events)
	var members, lines [][]byte
	w, _ := gzip.NewWriterLevel(nil, 1)
	for len(plain) > 0 {
		i := bytes.IndexByte(plain, '\n') + 1
		var m bytes.Buffer
		w.Reset(&m)
		_, _ = w.Write(plain[:i])
		_ = w.Flush()
		_ = w.Close()
		members, lines = append(members, m.Bytes()), append(lines, plain[:i])
		plain = plain[i:]
	}
	size := 0
	for _, m := range members {
		size += len(m)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		send := lines
		if r.Header.Get("Accept-Encoding") == "gzip" {
			w.Header().Set("Content-Encoding", "gzip")
			send = members
		}
		w.WriteHeader(200)
		for _, m := range send {
			_, _ = w.Write(m)
			w.(http.Flusher).Flush()
		}
	}))
	b.Cleanup(upstream.Close)
	target, _ := url.Parse(upstream.URL)
	bare := httptest.NewServer(bareReverseProxy(target))
	b.Cleanup(bare.Close)
	plainSize := 0
	for _, l := range lines {
		plainSize += len(l)
	}
	watchgate := newTestProxyTo(b, &enginetest.Engine{}, upstreamConfig(upstream.URL)).URL
	for _, via := range []struct {
		name    string
		url     string
		encoded bool
	}{{"bare", bare.URL, true}, {"watchgate", watchgate, true}, {"watchgate-identity", watchgate, false}} {
		b.Run(via.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
			size := size
			if !via.encoded {
				size = plainSize
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			cpu0 := cputime.Process()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodGet, via.url+"/api/v1/namespaces/bench/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", nil)
				req.Header.Set("Authorization", "Bearer alice")
				if via.encoded {
					req.Header.Set("Accept-Encoding", "gzip")
				}
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if n != int64(size) {
					b.Fatalf("read %d bytes, want %d", n, size)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/events, "ns/event")
			b.ReportMetric(float64((cputime.Process()-cpu0)/time.Nanosecond)/float64(b.N)/events, "cpu-ns/event")
		})
	}
}
