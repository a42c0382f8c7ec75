package inspect

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
)

// recordingSink records what an inspector reports.
type recordingSink struct {
	events int
	errors []int32
}

func (s *recordingSink) SawEvent() { s.events++ }
func (s *recordingSink) SawError(obj k8sruntime.Object) {
	s.errors = append(s.errors, streamtest.StatusCode(obj, nil))
}

// inspect feeds data to a new inspector in chunks of the given sizes
// (cycled) and returns what it reported.
func inspect(t testing.TB, contentType string, data []byte, chunks []int) (*recordingSink, *Stream) {
	f, s, _, ok := FramingFor(contentType, "")
	if !ok {
		t.Fatalf("no framing for %s", contentType)
	}
	sink := &recordingSink{}
	in := NewStream(f, s, sink)
	for i := 0; len(data) > 0; i++ {
		n := len(data)
		if len(chunks) > 0 {
			n = min(n, max(1, chunks[i%len(chunks)]))
		}
		in.Write(data[:n])
		data = data[n:]
	}
	in.Release()
	return sink, in
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
			want, _ := streamtest.ReferenceErrors(t, streamtest.JSONWatchType, []byte(stream))
			for _, chunks := range [][]int{nil, {1}, {2, 3}, {7}, {16, 17}, {41}, {42}} {
				sink, _ := inspect(t, streamtest.JSONWatchType, []byte(stream), chunks)
				if !slices.Equal(sink.errors, want) {
					t.Errorf("chunks %v: inspector found errors %v, the full decode %v", chunks, sink.errors, want)
				}
			}
		})
	}
	t.Run("protobuf", func(t *testing.T) {
		stream := bytes.Join(streamtest.ProtobufFrames(t), nil)
		want, clean := streamtest.ReferenceErrors(t, streamtest.ProtobufWatchType, stream)
		if !clean || !slices.Equal(want, []int32{410}) {
			t.Fatalf("reference: %v clean=%v", want, clean)
		}
		for _, chunks := range [][]int{nil, {1}, {3, 5}} {
			if sink, _ := inspect(t, streamtest.ProtobufWatchType, stream, chunks); !slices.Equal(sink.errors, want) || sink.events != 2 {
				t.Errorf("chunks %v: errors %v events %d, want %v and 2", chunks, sink.errors, sink.events, want)
			}
		}
	})
}

// Issue 9 finding 4: a frame over MaxInspectedFrameBytes ends inspection
// and nothing of it is buffered; the bytes pass through untouched.
func TestInspectorStopsAtFramesOverTheLimit(t *testing.T) {
	big := `{"type":"ADDED","object":{"data":"` + strings.Repeat("x", MaxInspectedFrameBytes) + `"}}` + "\n"
	sink, in := inspect(t, streamtest.JSONWatchType, []byte(big+`{"type":"ERROR","object":{}}`), []int{32 << 10})
	if !in.off || in.buf != nil || len(sink.errors) != 0 {
		t.Errorf("JSON: off=%v buffered=%v errors=%v; want inspection stopped, nothing buffered, nothing seen after", in.off, in.buf != nil, sink.errors)
	}
	pb := streamtest.LengthPrefixed(make([]byte, MaxInspectedFrameBytes+1))
	sink, in = inspect(t, streamtest.ProtobufWatchType, pb[:4+64<<10], []int{32 << 10})
	if !in.off || in.buf != nil || sink.events != 0 {
		t.Errorf("protobuf: off=%v buffered=%v; want inspection stopped at the header", in.off, in.buf != nil)
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
	frames := streamtest.ProtobufFrames(t) // ADDED, MODIFIED, ERROR
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
		"type ADDED, then ERROR: the last wins":  {streamtest.LengthPrefixed(append(field(1, "ADDED"), payload(frames[2])...)), 1},
		"type ERROR, then ADDED: the last wins":  {streamtest.LengthPrefixed(append(payload(frames[2]), field(1, "ADDED")...)), 0},
		"field 2^32+1 is field 1 to Unmarshal":   {streamtest.LengthPrefixed(append(payload(frames[0]), field(1<<32+1, "ERROR")...)), 1},
		"a length past the frame: the old check": {streamtest.LengthPrefixed([]byte{0x0a, 0x7f, 'E', 'R', 'R', 'O', 'R'}), 1},
	} {
		t.Run(name, func(t *testing.T) {
			want, _ := streamtest.ReferenceErrors(t, streamtest.ProtobufWatchType, tc.frame)
			_, s, _, _ := FramingFor(streamtest.ProtobufWatchType, "")
			counting := &countingSerializer{Serializer: s}
			sink := &recordingSink{}
			in := NewStream(LengthPrefixedFraming, counting, sink)
			in.Write(tc.frame)
			if !slices.Equal(sink.errors, want) {
				t.Errorf("errors %v, the full decode %v", sink.errors, want)
			}
			if counting.decodes != tc.wantDecodes {
				t.Errorf("%d frames decoded, want %d", counting.decodes, tc.wantDecodes)
			}
		})
	}
}

// endSink records the end of initial events besides what recordingSink
// does.
type endSink struct {
	recordingSink
	ends int
	// endsBefore is how many events had been seen when the first end came.
	endsBefore int
}

func (s *endSink) SawInitialEventsEnd() {
	if s.ends == 0 {
		s.endsBefore = s.events
	}
	s.ends++
}

// The bookmark that ends a watch-list's initial events is recognised in
// JSON and protobuf, whatever the chunking; an object that merely holds
// the annotation's text, or a bookmark without it, is not that bookmark.
func TestInspectorSeesTheEndOfInitialEvents(t *testing.T) {
	end := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{ResourceVersion: "44", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}},
	}
	plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "45"}}
	mimic := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: "43"},
		Data: map[string]string{"note": metav1.InitialEventsAnnotationKey}}
	for _, contentType := range []string{"application/json", streamtest.ProtobufWatchType} {
		t.Run(contentType, func(t *testing.T) {
			encode := func(events ...watch.Event) []byte {
				mediaType, _, _ := strings.Cut(contentType, ";")
				info, ok := k8sruntime.SerializerInfoForMediaType(clientgoscheme.Codecs.SupportedMediaTypes(), mediaType)
				if !ok {
					t.Fatal("no serializer")
				}
				var buf bytes.Buffer
				enc := restclientwatch.NewEncoder(streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&buf), info.StreamSerializer.Serializer),
					clientgoscheme.Codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion))
				for i := range events {
					if err := enc.Encode(&events[i]); err != nil {
						t.Fatal(err)
					}
				}
				return buf.Bytes()
			}
			complete := encode(watch.Event{Type: watch.Added, Object: mimic}, watch.Event{Type: watch.Bookmark, Object: end}, watch.Event{Type: watch.Bookmark, Object: plain})
			incomplete := encode(watch.Event{Type: watch.Added, Object: mimic}, watch.Event{Type: watch.Bookmark, Object: plain},
				watch.Event{Type: watch.Modified, Object: end})
			for _, chunks := range [][]int{nil, {1}, {7, 3}} {
				sink := &endSink{}
				feed(t, contentType, complete, chunks, sink)
				if sink.ends != 1 || sink.endsBefore != 1 || sink.events != 3 {
					t.Errorf("chunks %v, complete: ends=%d after %d events, events=%d; want 1 end after 1 event, 3 events", chunks, sink.ends, sink.endsBefore, sink.events)
				}
				sink = &endSink{}
				feed(t, contentType, incomplete, chunks, sink)
				if sink.ends != 0 || sink.events != 3 {
					t.Errorf("chunks %v, incomplete: ends=%d, events=%d; want 0 ends, 3 events", chunks, sink.ends, sink.events)
				}
			}
		})
	}
}

// feed writes data to a new Stream for sink in chunks of the given sizes.
func feed(t *testing.T, contentType string, data []byte, chunks []int, sink Sink) {
	t.Helper()
	f, s, _, ok := FramingFor(contentType, "")
	if !ok {
		t.Fatalf("no framing for %s", contentType)
	}
	in := NewStream(f, s, sink)
	for i := 0; len(data) > 0; i++ {
		n := len(data)
		if len(chunks) > 0 {
			n = min(n, max(1, chunks[i%len(chunks)]))
		}
		in.Write(data[:n])
		data = data[n:]
	}
	in.Release()
}
