package streamtest

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/watchgate/watchgate/proxy/internal/answer"
)

const (
	JSONWatchType     = "application/json"
	ProtobufWatchType = "application/vnd.kubernetes.protobuf;stream=watch"
)

// ReferenceStreamInfo is apimachinery's own way to read a watch stream of
// contentType: the oracle the inspector is checked against.
func ReferenceStreamInfo(contentType string) (runtime.StreamSerializerInfo, bool) {
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return runtime.StreamSerializerInfo{}, false
	}
	info, ok := runtime.SerializerInfoForMediaType(answer.MetaCodecs.SupportedMediaTypes(), mediaType)
	if !ok || info.StreamSerializer == nil {
		return runtime.StreamSerializerInfo{}, false
	}
	return *info.StreamSerializer, true
}

// ReferenceErrors decodes the whole stream with apimachinery's framer and
// streaming decoder, as the proxy did before it framed streams itself, and
// returns the code of each ERROR event's Status (0 when not a Status), and
// whether the decoder read to the end without an error.
func ReferenceErrors(t testing.TB, contentType string, data []byte) (codes []int32, clean bool) {
	info, ok := ReferenceStreamInfo(contentType)
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
			codes = append(codes, StatusCode(runtime.Decode(answer.MetaCodecs.UniversalDeserializer(), ev.Object.Raw)))
		}
	}
}

// StatusCode is the code of obj when it decoded (err nil) to a Status, 0
// otherwise.
func StatusCode(obj runtime.Object, err error) int32 {
	if s, ok := obj.(*metav1.Status); ok && err == nil {
		return s.Code
	}
	return 0
}

// LengthPrefixed is payload as one protobuf watch frame: its length as 4
// big-endian bytes, then the payload.
func LengthPrefixed(payload []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...) //nolint:gosec // test data
}

// JSONFrames is a JSON watch stream as kube-apiserver writes it, one frame
// per event: ADDED, MODIFIED, then an ERROR 410 Expired.
func JSONFrames() [][]byte {
	return [][]byte{
		[]byte(`{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"43"}}}` + "\n"),
		[]byte(`{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"44"}}}` + "\n"),
		[]byte(`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 42 (50)","reason":"Expired","code":410}}` + "\n"),
	}
}

// ProtobufFrames encodes events the way kube-apiserver does: a
// length-delimited stream of raw WatchEvents embedding enveloped objects.
func ProtobufFrames(t testing.TB) [][]byte {
	info, ok := runtime.SerializerInfoForMediaType(answer.MetaCodecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	okStatus := &metav1.Status{Status: metav1.StatusSuccess, Code: 200}
	gone := apierrors.NewResourceExpired("The resourceVersion for the provided watch is too old.").Status()
	var frames [][]byte
	for _, ev := range []watch.Event{{Type: watch.Added, Object: okStatus}, {Type: watch.Modified, Object: okStatus}, {Type: watch.Error, Object: &gone}} {
		var buf bytes.Buffer
		enc := restclientwatch.NewEncoder(streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&buf), info.StreamSerializer.Serializer),
			answer.MetaCodecs.EncoderForVersion(info.Serializer, answer.StatusVersion))
		if err := enc.Encode(&ev); err != nil {
			t.Fatal(err)
		}
		frames = append(frames, buf.Bytes())
	}
	return frames
}

// GzipMembers encodes groups of frames as kube-apiserver encodes a
// watch-list for a client that accepts gzip: one gzip member (level 1,
// flushed then closed) per flush, here per group.
func GzipMembers(t testing.TB, groups ...[][]byte) []byte {
	t.Helper()
	var out bytes.Buffer
	w, err := gzip.NewWriterLevel(&out, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		w.Reset(&out)
		for _, f := range g {
			if _, err := w.Write(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

// ManyEvents returns n JSON ADDED events of about 300 bytes, then an ERROR
// 410.
func ManyEvents(n int) [][]byte {
	frames := make([][]byte, 0, n+1)
	for i := range n {
		frames = append(frames, fmt.Appendf(nil, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-%d","namespace":"ns","resourceVersion":"%d"},"data":{"k":"%s"}}}`+"\n",
			i, 100+i, strings.Repeat(fmt.Sprint(i%10), 200)))
	}
	return append(frames, JSONFrames()[2])
}

// MemberReads encodes each group of frames as one gzip member, as
// kube-apiserver flushes them, and returns one read per member.
func MemberReads(t testing.TB, groups ...[][]byte) [][]byte {
	t.Helper()
	reads := make([][]byte, len(groups))
	for i, g := range groups {
		reads[i] = GzipMembers(t, g)
	}
	return reads
}

// ChunkedReader returns its reads one per Read, the last with end (nil:
// io.EOF in a Read of its own).
type ChunkedReader struct {
	Reads [][]byte
	End   error
	Last  bool // the end comes with the last bytes
}

func (r *ChunkedReader) Read(p []byte) (int, error) {
	if len(r.Reads) == 0 {
		if r.End != nil {
			return 0, r.End
		}
		return 0, io.EOF
	}
	n := copy(p, r.Reads[0])
	if r.Reads[0] = r.Reads[0][n:]; len(r.Reads[0]) == 0 {
		r.Reads = r.Reads[1:]
	}
	if len(r.Reads) == 0 && r.Last {
		if r.End != nil {
			return n, r.End
		}
		return n, io.EOF
	}
	return n, nil
}
