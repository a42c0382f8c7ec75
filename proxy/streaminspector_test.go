package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"mime"
	"runtime"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	restclientwatch "k8s.io/client-go/rest/watch"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/ratelimit"
)

const (
	jsonWatchType     = "application/json"
	protobufWatchType = "application/vnd.kubernetes.protobuf;stream=watch"
)

// referenceStreamInfo is apimachinery's own way to read a watch stream of
// contentType: the oracle the inspector is checked against.
func referenceStreamInfo(contentType string) (k8sruntime.StreamSerializerInfo, bool) {
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return k8sruntime.StreamSerializerInfo{}, false
	}
	info, ok := k8sruntime.SerializerInfoForMediaType(answer.MetaCodecs.SupportedMediaTypes(), mediaType)
	if !ok || info.StreamSerializer == nil {
		return k8sruntime.StreamSerializerInfo{}, false
	}
	return *info.StreamSerializer, true
}

// referenceErrors decodes the whole stream with apimachinery's framer and
// streaming decoder, as the proxy did before it framed streams itself, and
// returns the code of each ERROR event's Status (0 when not a Status), and
// whether the decoder read to the end without an error.
func referenceErrors(t testing.TB, contentType string, data []byte) (codes []int32, clean bool) {
	info, ok := referenceStreamInfo(contentType)
	if !ok {
		t.Fatalf("no stream serializer for %s", contentType)
	}
	dec := streaming.NewDecoder(info.Framer.NewFrameReader(io.NopCloser(bytes.NewReader(data))), info.Serializer)
	for {
		var ev metav1.WatchEvent
		if _, _, err := dec.Decode(nil, &ev); err != nil {
			return codes, errors.Is(err, io.EOF)
		}
		if ev.Type == string(watch.Error) {
			codes = append(codes, statusCode(k8sruntime.Decode(answer.MetaCodecs.UniversalDeserializer(), ev.Object.Raw)))
		}
	}
}

func statusCode(obj k8sruntime.Object, err error) int32 {
	if s, ok := obj.(*metav1.Status); ok && err == nil {
		return s.Code
	}
	return 0
}

// recordingSink records what an inspector reports.
type recordingSink struct {
	events int
	errors []int32
}

func (s *recordingSink) sawEvent() { s.events++ }
func (s *recordingSink) sawError(obj k8sruntime.Object) {
	s.errors = append(s.errors, statusCode(obj, nil))
}

// inspect feeds data to a new inspector in chunks of the given sizes
// (cycled) and returns what it reported.
func inspect(t testing.TB, contentType string, data []byte, chunks []int) (*recordingSink, *streamInspector) {
	f, s, _, ok := streamFramingFor(contentType, "")
	if !ok {
		t.Fatalf("no framing for %s", contentType)
	}
	sink := &recordingSink{}
	in := newStreamInspector(f, s, sink)
	for i := 0; len(data) > 0; i++ {
		n := len(data)
		if len(chunks) > 0 {
			n = min(n, max(1, chunks[i%len(chunks)]))
		}
		in.write(data[:n])
		data = data[n:]
	}
	in.release()
	return sink, in
}

func lengthPrefixed(payload []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...) //nolint:gosec // test data
}

// The inspector finds the same ERROR events as apimachinery's decoder,
// whatever the whitespace, key order, escapes or chunking, and decodes
// only frames that can be ERROR events.
func TestInspectorFindsErrorEventsAsTheFullDecodeDoes(t *testing.T) {
	gone := `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old","reason":"Expired","code":410}`
	for name, stream := range map[string]string{
		"compact, one per line":    `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a"}}}` + "\n" + `{"type":"ERROR","object":` + gone + "}\n",
		"keys reordered":           `{"object":` + gone + `,"type":"ERROR"}`,
		"pretty printed":           "{\n  \"type\" : \"ERROR\",\n\t\"object\": " + gone + "\n}\n\n",
		"no separator":             `{"type":"ADDED","object":{}}{"type":"ERROR","object":` + gone + `}`,
		"escaped type":             `{"type":"\u0045RR\u004fR","object":` + gone + `}`,
		"ERROR inside a string":    `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","data":{"k":"ERROR \"}{\\"}}}` + "\n" + `{"type":"ERROR","object":` + gone + `}`,
		"ERROR as a nested type":   `{"type":"MODIFIED","object":{"kind":"Event","apiVersion":"v1","type":"ERROR"}}`,
		"null between":             `null {"type":"ERROR","object":` + gone + `}`,
		"backslashes before quote": `{"type":"ADDED","object":{"a":"\\\\","b":"\\\""}}{"type":"ERROR","object":` + gone + `}`,
		"long strings, escapes past 16 bytes": `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","data":{"k":"` + strings.Repeat("x", 40) +
			`\"}{\\` + strings.Repeat("y", 40) + `\\\\\"ERROR\"` + strings.Repeat("z", 17) + `\\"}}}` + "\n" + `{"type":"ERROR","object":` + gone + `}`,
	} {
		t.Run(name, func(t *testing.T) {
			want, _ := referenceErrors(t, jsonWatchType, []byte(stream))
			for _, chunks := range [][]int{nil, {1}, {2, 3}, {7}, {16, 17}, {41}, {42}} {
				sink, _ := inspect(t, jsonWatchType, []byte(stream), chunks)
				if !slices.Equal(sink.errors, want) {
					t.Errorf("chunks %v: inspector found errors %v, the full decode %v", chunks, sink.errors, want)
				}
			}
		})
	}
	t.Run("protobuf", func(t *testing.T) {
		stream := bytes.Join(protobufFrames(t), nil)
		want, clean := referenceErrors(t, protobufWatchType, stream)
		if !clean || !slices.Equal(want, []int32{410}) {
			t.Fatalf("reference: %v clean=%v", want, clean)
		}
		for _, chunks := range [][]int{nil, {1}, {3, 5}} {
			if sink, _ := inspect(t, protobufWatchType, stream, chunks); !slices.Equal(sink.errors, want) || sink.events != 2 {
				t.Errorf("chunks %v: errors %v events %d, want %v and 2", chunks, sink.errors, sink.events, want)
			}
		}
	})
}

// Issue 9 finding 4: a frame over MaxInspectedFrameBytes ends inspection
// and nothing of it is buffered; the bytes pass through untouched.
func TestInspectorStopsAtFramesOverTheLimit(t *testing.T) {
	big := `{"type":"ADDED","object":{"data":"` + strings.Repeat("x", MaxInspectedFrameBytes) + `"}}` + "\n"
	sink, in := inspect(t, jsonWatchType, []byte(big+`{"type":"ERROR","object":{}}`), []int{32 << 10})
	if !in.off || in.buf != nil || len(sink.errors) != 0 {
		t.Errorf("JSON: off=%v buffered=%v errors=%v; want inspection stopped, nothing buffered, nothing seen after", in.off, in.buf != nil, sink.errors)
	}
	pb := lengthPrefixed(make([]byte, MaxInspectedFrameBytes+1))
	sink, in = inspect(t, protobufWatchType, pb[:4+64<<10], []int{32 << 10})
	if !in.off || in.buf != nil || sink.events != 0 {
		t.Errorf("protobuf: off=%v buffered=%v; want inspection stopped at the header", in.off, in.buf != nil)
	}
}

// Through the whole watch path, a 64 MiB single-line frame costs a bounded
// heap: inspection stops at MaxInspectedFrameBytes and the rest streams.
func TestHugeFrameHeapIsBounded(t *testing.T) {
	const frame = 64 << 20
	for _, contentType := range []string{jsonWatchType, protobufWatchType} {
		t.Run(contentType, func(t *testing.T) {
			var head []byte
			if contentType == jsonWatchType {
				head = []byte(`{"type":"ADDED","object":{"data":"`)
			} else {
				head = lengthPrefixed(make([]byte, frame))[:4]
			}
			src := io.MultiReader(bytes.NewReader(head), io.LimitReader(zeroes{'x'}, frame))
			peak, n := peakHeapWhileCopying(t, contentType, src)
			if n != int64(len(head))+frame {
				t.Fatalf("copied %d bytes, want %d", n, int64(len(head))+frame)
			}
			if limit := uint64(MaxInspectedFrameBytes) * 4; peak > limit {
				t.Errorf("%d MiB allocated while a 64 MiB frame passed, want at most %d MiB", peak>>20, limit>>20)
			}
		})
	}
}

type zeroes struct{ b byte }

func (z zeroes) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = z.b
	}
	return len(p), nil
}

// peakHeapWhileCopying copies src through a watchBody to io.Discard and
// returns the bytes allocated meanwhile (all of them, collected or not:
// an upper bound of the heap the copy needed) and the bytes copied.
func peakHeapWhileCopying(t *testing.T, contentType string, src io.Reader) (uint64, int64) {
	engine := &fakeEngine{}
	ws := &watchState{engine: engine, clock: clock.RealClock{}, c: &classification{}, log: discardLogs()}
	b := newWatchBody(ws, io.NopCloser(src), contentType, "")
	buf := make([]byte, 32<<10)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var n int64
	for {
		k, err := b.Read(buf)
		n += int64(k)
		if err != nil {
			break
		}
	}
	_ = b.Close()
	runtime.ReadMemStats(&after)
	t.Logf("%d MiB streamed, %d KiB allocated", n>>20, (after.TotalAlloc-before.TotalAlloc)>>10)
	return after.TotalAlloc - before.TotalAlloc, n
}

// FuzzInspectorJSON and FuzzInspectorProtobuf: on arbitrary bytes and
// chunkings the inspector never panics, keeps at most one frame of at
// most MaxInspectedFrameBytes, passes every byte through unchanged, ends
// the watch exactly once, and agrees with apimachinery's full decode on
// every ERROR event up to where that decoder stops.
func FuzzInspectorJSON(f *testing.F) {
	for _, fr := range jsonFrames() {
		f.Add(fr, uint16(0))
	}
	f.Add(bytes.Join(jsonFrames(), nil), uint16(3))
	f.Add([]byte(`{"object":{"code":410,"kind":"Status","apiVersion":"v1"},"type":"\u0045RROR"} [1,"a\"b"] null`), uint16(1))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16) { fuzzInspector(t, jsonWatchType, data, int(chunk)) })
}

func FuzzInspectorProtobuf(f *testing.F) {
	frames := protobufFrames(f)
	for _, fr := range frames {
		f.Add(fr, uint16(0))
	}
	f.Add(bytes.Join(frames, nil), uint16(5))
	f.Add(append(lengthPrefixed([]byte("ERROR")), "ERROR"...), uint16(1))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16) { fuzzInspector(t, protobufWatchType, data, int(chunk)) })
}

func fuzzInspector(t *testing.T, contentType string, data []byte, chunk int) {
	want, clean := referenceErrors(t, contentType, data)
	sink, _ := inspect(t, contentType, data, []int{chunk})
	if clean && !slices.Equal(sink.errors, want) || len(sink.errors) < len(want) || !slices.Equal(sink.errors[:len(want)], want) {
		t.Fatalf("inspector found errors %v, the full decode %v (decoded to the end: %v)", sink.errors, want, clean)
	}

	// Through a watchBody: bytes unchanged, one end.
	engine := &fakeEngine{}
	ws := &watchState{engine: engine, clock: clock.RealClock{}, c: &classification{ResourceVersion: "7"}, log: discardLogs(),
		clientCtx: t.Context(), cancel: func() {}}
	b := newWatchBody(ws, io.NopCloser(bytes.NewReader(data)), contentType, "")
	ws.body = b
	var out bytes.Buffer
	if _, err := io.CopyBuffer(&out, struct{ io.Reader }{b}, make([]byte, max(1, chunk%4096+1))); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatal("the stream's bytes changed on their way through")
	}
	if b.inspect.buf != nil && len(*b.inspect.buf) > MaxInspectedFrameBytes {
		t.Fatalf("%d bytes buffered, over the limit", len(*b.inspect.buf))
	}
	ws.end()
	ws.end()
	if _, ended, _ := engine.snapshot(); len(ended) != 1 {
		t.Fatalf("WatchEnded called %d times, want 1", len(ended))
	}
	if wantOutcome := ratelimit.OutcomeClosed; len(sink.errors) > 0 {
		wantOutcome = ratelimit.OutcomeError
		if _, ended, _ := engine.snapshot(); ended[0] != wantOutcome {
			t.Fatalf("outcome %v after ERROR events, want %v", ended[0], wantOutcome)
		}
	}
}

// countingSerializer counts the frames the inspector decodes.
type countingSerializer struct {
	k8sruntime.Serializer
	decodes int
}

func (c *countingSerializer) Decode(data []byte, gvk *schema.GroupVersionKind, into k8sruntime.Object) (k8sruntime.Object, *schema.GroupVersionKind, error) {
	c.decodes++
	return c.Serializer.Decode(data, gvk, into)
}

// A protobuf event's type is its first field: a frame whose object holds
// the text ERROR is not decoded unless its type is ERROR, and the type is
// read as the generated Unmarshal reads it (the last field 1 wins; a field
// number is an int32).
func TestProtobufEventTypeIsReadWithoutDecoding(t *testing.T) {
	frames := protobufFrames(t) // ADDED, MODIFIED, ERROR
	payload := func(fr []byte) []byte { return fr[4:] }
	field := func(num uint64, value string) []byte {
		b := binary.AppendUvarint(nil, num<<3|2)
		b = binary.AppendUvarint(b, uint64(len(value)))
		return append(b, value...)
	}
	errorInData := apierrors.NewBadRequest("ERROR ERROR ERROR").Status()
	var withErrorText bytes.Buffer
	info, _ := k8sruntime.SerializerInfoForMediaType(answer.MetaCodecs.SupportedMediaTypes(), k8sruntime.ContentTypeProtobuf)
	enc := restclientwatch.NewEncoder(streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&withErrorText), info.StreamSerializer.Serializer),
		answer.MetaCodecs.EncoderForVersion(info.Serializer, answer.StatusVersion))
	if err := enc.Encode(&watch.Event{Type: watch.Added, Object: &errorInData}); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		frame       []byte
		wantDecodes int
	}{
		"an ADDED event":                         {frames[0], 0},
		"an ADDED event whose object says ERROR": {withErrorText.Bytes(), 0},
		"an ERROR event":                         {frames[2], 1},
		"type ADDED, then ERROR: the last wins":  {lengthPrefixed(append(field(1, "ADDED"), payload(frames[2])...)), 1},
		"type ERROR, then ADDED: the last wins":  {lengthPrefixed(append(payload(frames[2]), field(1, "ADDED")...)), 0},
		"field 2^32+1 is field 1 to Unmarshal":   {lengthPrefixed(append(payload(frames[0]), field(1<<32+1, "ERROR")...)), 1},
		"a length past the frame: the old check": {lengthPrefixed([]byte{0x0a, 0x7f, 'E', 'R', 'R', 'O', 'R'}), 1},
	} {
		t.Run(name, func(t *testing.T) {
			want, _ := referenceErrors(t, protobufWatchType, tc.frame)
			_, s, _, _ := streamFramingFor(protobufWatchType, "")
			counting := &countingSerializer{Serializer: s}
			sink := &recordingSink{}
			in := newStreamInspector(lengthPrefixedFraming, counting, sink)
			in.write(tc.frame)
			if !slices.Equal(sink.errors, want) {
				t.Errorf("errors %v, the full decode %v", sink.errors, want)
			}
			if counting.decodes != tc.wantDecodes {
				t.Errorf("%d frames decoded, want %d", counting.decodes, tc.wantDecodes)
			}
		})
	}
}
