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
// kube-apiserver sends it to a client that accepts gzip, a gzip member per
// flush (the members are encoded once, beforehand), from an httptest
// upstream through a bare httputil.ReverseProxy and through watchgate's
// whole chain, which inflates a copy of what can hold an ERROR event to
// inspect it, and, for scale, the same events unencoded through watchgate
// (watchgate-identity). Two shapes: a member per event, as when the
// encoder keeps up with the events, and a member per 500 events then the
// bookmark that ends the initial events in a member of its own (burst-),
// as when a backlog waits, as in a replay of kube-apiserver's watch cache
// (members of 2 to 95 KiB there). The client reads the encoded bytes. It
// reports wall and CPU time per event (client, proxy and upstream in one
// process: the difference between the two is the proxy's).
func BenchmarkGzipWatchThroughProxy(b *testing.B) {
	const events = 3000
	plain := bytes.SplitAfter(streamtest.BenchEvents(events), []byte("\n"))
	plain = plain[:len(plain)-1] // the empty piece after the last newline
	for _, shape := range []struct {
		name      string
		perMember int
		vias      []string
	}{
		{"", 1, []string{"bare", "watchgate", "watchgate-identity"}},
		{"burst-", 500, []string{"bare", "watchgate"}},
	} {
		members := gzipMembersOf(plain, shape.perMember)
		if shape.perMember > 1 {
			// The bookmark that ends the initial events, flushed on its own.
			members = append(members, gzipMembersOf([][]byte{initialEventsEnd}, 1)...)
		}
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			send := plain
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
		watchgate := newTestProxyTo(b, &enginetest.Engine{}, upstreamConfig(upstream.URL)).URL
		for _, via := range shape.vias {
			u, encoded, size := watchgate, via != "watchgate-identity", bytesIn(members)
			if via == "bare" {
				u = bare.URL
			}
			if !encoded {
				size = bytesIn(plain)
			}
			b.Run(shape.name+via, func(b *testing.B) {
				client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				cpu0 := cputime.Process()
				for b.Loop() {
					req, _ := http.NewRequest(http.MethodGet, u+"/api/v1/namespaces/bench/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", nil)
					req.Header.Set("Authorization", "Bearer alice")
					if encoded {
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
}

// initialEventsEnd is the bookmark that ends a watch-list's initial events.
var initialEventsEnd = []byte(`{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"4000","creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}}}}` + "\n")

// gzipMembersOf encodes events as kube-apiserver's watch-lists are: one
// gzip member (level 1, flushed, then closed) per perMember events.
func gzipMembersOf(events [][]byte, perMember int) [][]byte {
	var members [][]byte
	w, _ := gzip.NewWriterLevel(nil, 1)
	for i := 0; i < len(events); i += perMember {
		var m bytes.Buffer
		w.Reset(&m)
		for _, e := range events[i:min(len(events), i+perMember)] {
			_, _ = w.Write(e)
		}
		_ = w.Flush()
		_ = w.Close()
		members = append(members, m.Bytes())
	}
	return members
}

// bytesIn is the total length of pieces.
func bytesIn(pieces [][]byte) int {
	n := 0
	for _, p := range pieces {
		n += len(p)
	}
	return n
}
