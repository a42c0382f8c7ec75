package proxy

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// benchEvents is a JSON watch stream of n MODIFIED events of ~1.2 KiB
// ConfigMaps, as kube-apiserver writes them (one compact value per line).
func benchEvents(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-%d","namespace":"bench","uid":"6f1c8a2e-4b1d-4c53-9a57-%012d","resourceVersion":"%d","creationTimestamp":"2026-12-02T17:00:00Z","labels":{"app":"bench","tier":"backend"},"annotations":{"note":"%s"},"managedFields":[{"manager":"kubectl","operation":"Update","apiVersion":"v1","time":"2026-12-02T17:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:k":{}}}}]},"data":{"k":"%s"}}}`+"\n",
			i, i, 1000+i, strings.Repeat("a", 200), strings.Repeat("v", 600))
	}
	return b.Bytes()
}

// BenchmarkWatchBodyRead reads a 3,000-event JSON stream through a
// watchBody: plain (not inspected), inspected (the proxy's inspector), and
// fullDecode (every event decoded with apimachinery's framer and decoder,
// as the proxy did before). ns/op is per stream; see ns/event.
//
//	go test -run '^$' -bench BenchmarkWatchBodyRead -benchmem ./proxy/
func BenchmarkWatchBodyRead(b *testing.B) {
	stream := benchEvents(3000)
	buf := make([]byte, 32<<10)
	ws := &watchState{engine: &fakeEngine{}, clock: clock.RealClock{}, c: &classification{Info: &request.RequestInfo{}}, log: discardLogs()}
	for _, mode := range []string{"plain", "inspected", "fullDecode"} {
		b.Run(mode, func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				src := io.NopCloser(bytes.NewReader(stream))
				switch mode {
				case "fullDecode":
					info, _ := referenceStreamInfo(jsonWatchType)
					pr, pw := io.Pipe()
					done := make(chan struct{})
					go func() {
						defer close(done)
						dec := streaming.NewDecoder(info.Framer.NewFrameReader(pr), info.Serializer)
						for {
							var ev metav1.WatchEvent
							if _, _, err := dec.Decode(nil, &ev); err != nil {
								_ = pr.CloseWithError(err)
								return
							}
						}
					}()
					_, _ = io.CopyBuffer(io.Discard, io.TeeReader(src, pw), buf)
					_ = pw.Close()
					<-done
				default:
					ct := jsonWatchType
					if mode == "plain" {
						ct = "text/plain"
					}
					body := newWatchBody(ws, src, ct, "")
					_, _ = io.CopyBuffer(io.Discard, struct{ io.Reader }{body}, buf)
					_ = body.Close()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/3000, "ns/event")
		})
	}
}

// BenchmarkWatchThroughProxy serves a 3,000-event JSON watch from an
// httptest upstream through a bare httputil.ReverseProxy (the floor) and
// through watchgate's whole chain (an engine that allows everything), and
// reports events/s as the client reads them.
//
//	go test -run '^$' -bench BenchmarkWatchThroughProxy -benchmem ./proxy/
func BenchmarkWatchThroughProxy(b *testing.B) {
	stream := benchEvents(3000)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		for rest := stream; len(rest) > 0; {
			n := min(len(rest), 16<<10)
			_, _ = w.Write(rest[:n])
			rest = rest[n:]
		}
	}))
	b.Cleanup(upstream.Close)
	target, _ := url.Parse(upstream.URL)
	bare := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	})
	b.Cleanup(bare.Close)
	for _, via := range []struct {
		name string
		url  string
	}{{"bare", bare.URL}, {"watchgate", newTestProxyTo(b, &fakeEngine{}, upstreamConfig(upstream.URL)).URL}} {
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
