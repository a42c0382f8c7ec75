package relay

import (
	"bytes"
	"io"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
)

// BenchmarkWatchBodyRead reads a 3,000-event stream through a watchBody,
// JSON and protobuf: plain (not inspected), inspected (the proxy's
// inspector), and, for JSON, fullDecode (every event decoded with
// apimachinery's framer and decoder, as the proxy did before). ns/op is per
// stream; see ns/event.
//
//	go test -run '^$' -bench BenchmarkWatchBodyRead -benchmem ./proxy/
func BenchmarkWatchBodyRead(b *testing.B) {
	streams := map[string][]byte{streamtest.JSONWatchType: streamtest.BenchEvents(3000), streamtest.ProtobufWatchType: streamtest.BenchProtobufEvents(b, 3000)}
	buf := make([]byte, 32<<10)
	ws := &Watch{engine: &enginetest.Engine{}, clock: clock.RealClock{}, c: &request.Classification{}, log: logtest.Discard()}
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
