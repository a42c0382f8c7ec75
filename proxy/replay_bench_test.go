package proxy

import (
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/watchgate/watchgate/internal/cputime"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
	"github.com/watchgate/watchgate/proxy/internal/upstreamtest"
)

// BenchmarkWatchReplayThroughProxy serves a 3,000-event JSON watch from an
// HTTPS HTTP/2 upstream that flushes after every event, as kube-apiserver
// does, through watchgate's chain, and reports the process's CPU per event.
//
//	go test -run '^$' -bench BenchmarkWatchReplayThroughProxy -count 5 ./proxy/
func BenchmarkWatchReplayThroughProxy(b *testing.B) {
	events := bytes.SplitAfter(streamtest.BenchEvents(3000), []byte("\n"))
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for _, e := range events {
			_, _ = w.Write(e)
			w.(http.Flusher).Flush()
		}
	}))
	up.EnableHTTP2 = true
	up.Config.ErrorLog = log.New(io.Discard, "", 0)
	up.StartTLS()
	b.Cleanup(up.Close)
	px := newTestProxyTo(b, &enginetest.Engine{}, upstreamtest.Trusting(up))
	client := &http.Client{}
	cpu0 := cputime.Process()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodGet, px.URL+"/api/v1/namespaces/bench/configmaps?watch=true", nil)
		req.Header.Set("Authorization", "Bearer alice")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	b.ReportMetric(float64((cputime.Process()-cpu0)/time.Nanosecond)/float64(b.N)/3000, "cpu-ns/event")
}
