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
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	restclientwatch "k8s.io/client-go/rest/watch"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
	"github.com/watchgate/watchgate/proxy/internal/upstreamtest"
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

// benchProtobufEvents is benchEvents as a protobuf watch stream, framed
// and encoded as kube-apiserver writes it (length-prefixed raw WatchEvents
// embedding enveloped ConfigMaps).
func benchProtobufEvents(tb testing.TB, n int) []byte {
	info, ok := k8sruntime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), k8sruntime.ContentTypeProtobuf)
	if !ok {
		tb.Fatal("no protobuf serializer")
	}
	var b bytes.Buffer
	enc := restclientwatch.NewEncoder(streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&b), info.StreamSerializer.Serializer),
		scheme.Codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion))
	for i := range n {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("cm-%d", i), Namespace: "bench", UID: types.UID(fmt.Sprintf("6f1c8a2e-4b1d-4c53-9a57-%012d", i)),
				ResourceVersion: fmt.Sprint(1000 + i), Labels: map[string]string{"app": "bench", "tier": "backend"},
				Annotations: map[string]string{"note": strings.Repeat("a", 200)},
			},
			Data: map[string]string{"k": strings.Repeat("v", 600)},
		}
		if err := enc.Encode(&watch.Event{Type: watch.Modified, Object: cm}); err != nil {
			tb.Fatal(err)
		}
	}
	return b.Bytes()
}

// BenchmarkWatchBodyRead reads a 3,000-event stream through a watchBody,
// JSON and protobuf: plain (not inspected), inspected (the proxy's
// inspector), and, for JSON, fullDecode (every event decoded with
// apimachinery's framer and decoder, as the proxy did before). ns/op is per
// stream; see ns/event.
//
//	go test -run '^$' -bench BenchmarkWatchBodyRead -benchmem ./proxy/
func BenchmarkWatchBodyRead(b *testing.B) {
	streams := map[string][]byte{streamtest.JSONWatchType: benchEvents(3000), streamtest.ProtobufWatchType: benchProtobufEvents(b, 3000)}
	buf := make([]byte, 32<<10)
	ws := &watchState{engine: &enginetest.Engine{}, clock: clock.RealClock{}, c: &request.Classification{}, log: logtest.Discard()}
	for _, mode := range []string{"plain", "inspected", "fullDecode", "protobuf/plain", "protobuf/inspected"} {
		b.Run(mode, func(b *testing.B) {
			contentType := streamtest.JSONWatchType
			if strings.HasPrefix(mode, "protobuf/") {
				contentType = streamtest.ProtobufWatchType
			}
			stream := streams[contentType]
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				src := io.NopCloser(bytes.NewReader(stream))
				switch mode {
				case "fullDecode":
					info, _ := streamtest.ReferenceStreamInfo(streamtest.JSONWatchType)
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
					ct := contentType
					if strings.HasSuffix(mode, "plain") {
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
// reports events/s as the client reads them. watchgate-h2 is watchgate in
// front of an upstream speaking HTTP/2 over TLS, as kube-apiserver does:
// the watch goes over watchgate's own HTTP/2 client (watchclient.go).
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
