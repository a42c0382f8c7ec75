package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/watchgate/watchgate/internal/cputime"
)

// eventAmongIdle is a JSON watch event of a small ConfigMap, as
// kube-apiserver writes it: one line.
const eventAmongIdle = `{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"g1","namespace":"load-1","uid":"0b3c2e7a-4f1e-4d55-9a36-2f1f0f8d8c11","resourceVersion":"123456","creationTimestamp":"2026-12-04T14:00:00Z","labels":{"load-group":"1"},"managedFields":[{"manager":"load","operation":"Update","apiVersion":"v1","time":"2026-12-04T14:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:loadts":{}}}}]},"data":{"loadts":"1796392800000000000"}}}` + "\n"

// BenchmarkEventAmongIdleWatches relays events one at a time, each on
// its own, over 20 client HTTP/2 connections that also hold 500 idle
// watches each (as make load's clients and an agent's transports do),
// directly, through a bare httputil.ReverseProxy and through watchgate's
// chain, TLS on both hops: the CPU each event costs the process
// (cpu-µs/event) and, less the direct path, the proxy
// (proxy-cpu-µs/event). An HTTP/2 server's write scheduler runs for every
// frame it writes and every frame it reads, so what it does per stream
// open on the connection, idle or not, is paid per event; the events go
// round the connections so that, as in a replica, what one touches is not
// in the cache for the next.
//
//	go test -run '^$' -bench BenchmarkEventAmongIdleWatches -benchtime 20000x -count 5 ./proxy/
func BenchmarkEventAmongIdleWatches(b *testing.B) {
	const conns, idle = 20, 500
	var next [conns]chan struct{} // the upstream writes an event on active watch k for each receive
	for k := range next {
		next[k] = make(chan struct{})
	}
	events := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		k, err := strconv.Atoi(r.URL.Query().Get("active"))
		if err != nil {
			<-r.Context().Done()
			return
		}
		for {
			select {
			case <-next[k]:
			case <-r.Context().Done():
				return
			}
			if _, err := io.WriteString(w, eventAmongIdle); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	// The upstream schedules its frames with x/net's random scheduler,
	// which looks only at streams with frames queued, so that what it
	// spends per event does not depend on how a path spreads the watches
	// over its connections, and the direct path's CPU can be subtracted
	// from the proxies'.
	upstream := httptest.NewUnstartedServer(events)
	upstream.EnableHTTP2 = true
	upstream.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1000}
	upstream.Config.ErrorLog = log.New(io.Discard, "", 0)
	if err := http2.ConfigureServer(upstream.Config, &http2.Server{NewWriteScheduler: http2.NewRandomWriteScheduler}); err != nil { //nolint:staticcheck // net/http has no way to choose the write scheduler; x/net's server with its random one does
		b.Fatal(err)
	}
	upstream.StartTLS()
	b.Cleanup(upstream.Close)
	var direct float64 // µs per event, subtracted from the proxies'
	for _, path := range benchPaths(b, upstream) {
		b.Run(path.name, func(b *testing.B) {
			srv := path.srv
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var active [conns]*bufio.Reader
			var opened, closed sync.WaitGroup
			for k := range conns {
				tr := srv.Client().Transport.(*http.Transport).Clone()
				tr.ForceAttemptHTTP2 = true
				defer tr.CloseIdleConnections()
				client := &http.Client{Transport: tr}
				watch := func(query string) *http.Response {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v1/namespaces/n/configmaps?watch=true"+query, nil)
					req.Header.Set("Authorization", "Bearer alice")
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return nil
					}
					if resp.StatusCode != http.StatusOK {
						b.Errorf("watch: status %d", resp.StatusCode)
					}
					return resp
				}
				resp := watch(fmt.Sprintf("&active=%d", k))
				if resp == nil {
					b.FailNow()
				}
				defer resp.Body.Close()
				active[k] = bufio.NewReader(resp.Body)
				opened.Add(1)
				closed.Go(func() {
					for range idle {
						if resp := watch(""); resp != nil {
							defer resp.Body.Close()
						}
					}
					opened.Done()
					<-ctx.Done()
				})
			}
			defer closed.Wait()
			defer cancel()
			opened.Wait()
			time.Sleep(100 * time.Millisecond) // the idle watches' last frames settle

			b.ResetTimer()
			cpu0 := cputime.Process()
			for i := range b.N {
				k := i % conns
				next[k] <- struct{}{}
				line, err := active[k].ReadSlice('\n')
				if err != nil || len(line) != len(eventAmongIdle) {
					b.Fatalf("event %d: %d bytes (%v), want %d", i, len(line), err, len(eventAmongIdle))
				}
			}
			perEvent := float64((cputime.Process() - cpu0).Microseconds()) / float64(b.N)
			b.StopTimer()
			b.ReportMetric(perEvent, "cpu-µs/event")
			if !path.proxied {
				direct = perEvent
			} else {
				b.ReportMetric(perEvent-direct, "proxy-cpu-µs/event")
			}
		})
	}
}
