package relay

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/callertest"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/inspect"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
	"github.com/watchgate/watchgate/ratelimit"
)

// zeroes is an endless stream of one byte.
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
	engine := &enginetest.Engine{}
	ws := &Watch{engine: engine, clock: clock.RealClock{}, c: &request.Classification{}, log: logtest.Discard()}
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

// Through the whole watch path, a 64 MiB single-line frame costs a bounded
// heap: inspection stops at MaxInspectedFrameBytes and the rest streams.
func TestHugeFrameHeapIsBounded(t *testing.T) {
	const frame = 64 << 20
	for _, contentType := range []string{streamtest.JSONWatchType, streamtest.ProtobufWatchType} {
		t.Run(contentType, func(t *testing.T) {
			var head []byte
			if contentType == streamtest.JSONWatchType {
				head = []byte(`{"type":"ADDED","object":{"data":"`)
			} else {
				head = streamtest.LengthPrefixed(make([]byte, frame))[:4]
			}
			src := io.MultiReader(bytes.NewReader(head), io.LimitReader(zeroes{'x'}, frame))
			peak, n := peakHeapWhileCopying(t, contentType, src)
			if n != int64(len(head))+frame {
				t.Fatalf("copied %d bytes, want %d", n, int64(len(head))+frame)
			}
			if limit := uint64(inspect.MaxInspectedFrameBytes) * 4; peak > limit {
				t.Errorf("%d MiB allocated while a 64 MiB frame passed, want at most %d MiB", peak>>20, limit>>20)
			}
		})
	}
}

// FuzzInspectorJSON and FuzzInspectorProtobuf: on arbitrary bytes and
// chunkings the inspector never panics, keeps at most one frame of at
// most MaxInspectedFrameBytes, passes every byte through unchanged, ends
// the watch exactly once, and agrees with apimachinery's full decode on
// every ERROR event up to where that decoder stops.
func FuzzInspectorJSON(f *testing.F) {
	for _, fr := range streamtest.JSONFrames() {
		f.Add(fr, uint16(0))
	}
	f.Add(bytes.Join(streamtest.JSONFrames(), nil), uint16(3))
	f.Add([]byte(`{"object":{"code":410,"kind":"Status","apiVersion":"v1"},"type":"\u0045RROR"} [1,"a\"b"] null`), uint16(1))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16) {
		fuzzInspector(t, streamtest.JSONWatchType, data, int(chunk))
	})
}

func FuzzInspectorProtobuf(f *testing.F) {
	frames := streamtest.ProtobufFrames(f)
	for _, fr := range frames {
		f.Add(fr, uint16(0))
	}
	f.Add(bytes.Join(frames, nil), uint16(5))
	f.Add(append(streamtest.LengthPrefixed([]byte("ERROR")), "ERROR"...), uint16(1))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16) {
		fuzzInspector(t, streamtest.ProtobufWatchType, data, int(chunk))
	})
}

func fuzzInspector(t *testing.T, contentType string, data []byte, chunk int) {
	want, clean := streamtest.ReferenceErrors(t, contentType, data)
	sink := inspectAll(t, contentType, data, chunk)
	if clean && !slices.Equal(sink.errors, want) || len(sink.errors) < len(want) || !slices.Equal(sink.errors[:len(want)], want) {
		t.Fatalf("inspector found errors %v, the full decode %v (decoded to the end: %v)", sink.errors, want, clean)
	}

	// Through a watchBody: bytes unchanged, one end.
	engine := &enginetest.Engine{}
	ws := &Watch{engine: engine, clock: clock.RealClock{}, c: &request.Classification{ResourceVersion: "7"}, log: logtest.Discard(),
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
	if n := b.inspect.BufferedBytes(); n > inspect.MaxInspectedFrameBytes {
		t.Fatalf("%d bytes buffered, over the limit", n)
	}
	ws.End()
	ws.End()
	if _, ended, _ := engine.Snapshot(); len(ended) != 1 {
		t.Fatalf("WatchEnded called %d times, want 1", len(ended))
	}
	wantOutcome := ratelimit.OutcomeClosed
	if len(sink.errors) > 0 {
		wantOutcome = ratelimit.OutcomeError
	}
	if _, ended, _ := engine.Snapshot(); ended[0] != wantOutcome {
		t.Fatalf("outcome %v after ERROR events %v, want %v", ended[0], sink.errors, wantOutcome)
	}
}

// Streams the proxy cannot frame are not inspected, encoded or not: CBOR
// (kube-apiserver 1.37 with CBORServingAndStorage), and encodings other
// than gzip. Their bytes pass untouched and nothing is allocated for them.
func TestStreamsNotInspected(t *testing.T) {
	for _, tc := range []struct{ contentType, encoding string }{
		{"application/cbor", ""},
		{"application/cbor-seq", ""},
		{"application/cbor", "gzip"},
		{streamtest.JSONWatchType, "br"},
		{streamtest.JSONWatchType, "deflate"},
	} {
		b := newWatchBody(&Watch{}, io.NopCloser(strings.NewReader("")), tc.contentType, tc.encoding)
		if b.inspect != nil || b.inflate != nil {
			t.Errorf("%s encoded %q: inspected", tc.contentType, tc.encoding)
		}
	}
	for _, encoding := range []string{"gzip", "GZIP"} {
		if b := newWatchBody(&Watch{}, io.NopCloser(strings.NewReader("")), streamtest.JSONWatchType, encoding); b.inflate == nil {
			t.Errorf("JSON encoded %q: not inflated", encoding)
		}
	}
	if b := newWatchBody(&Watch{}, io.NopCloser(strings.NewReader("")), streamtest.JSONWatchType, ""); b.inflate != nil {
		t.Error("an identity stream has an inflater")
	}
}

// How the stream ends does not matter: the ERROR in the member held is
// seen when EOF comes with the last bytes or alone, and when a read error
// cuts the stream after it. When the client left or the proxy closed the
// watch, what is held is dropped uninflated.
func TestGzipWatchBodyInflatesTheMemberHeldAtTheEnd(t *testing.T) {
	reads := streamtest.MemberReads(t, streamtest.JSONFrames()[:1], streamtest.JSONFrames()[1:2], streamtest.JSONFrames()[1:2], streamtest.JSONFrames()[2:])
	reset := errors.New("connection reset by peer")
	for name, tc := range map[string]struct {
		end        error
		last       bool
		clientGone bool
		wantError  bool
	}{
		"EOF with the last bytes":     {last: true, wantError: true},
		"EOF in a read of its own":    {wantError: true},
		"a read error after the last": {end: reset, wantError: true},
		"a read error with the last":  {end: reset, last: true, wantError: true},
		"the client left":             {end: context.Canceled, clientGone: true},
		"the proxy closed the watch":  {end: context.Canceled, clientGone: true},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			ws := &Watch{engine: &enginetest.Engine{}, clock: clock.RealClock{}, c: &request.Classification{ResourceVersion: "42"},
				log: logtest.Discard(), clientCtx: ctx, cancel: cancel}
			src := &streamtest.ChunkedReader{Reads: slices.Clone(reads), End: tc.end, Last: tc.last}
			b := newWatchBody(ws, io.NopCloser(src), streamtest.JSONWatchType, "gzip")
			budget := inspect.NewSharedBytes(1<<20, 1<<20)
			b.inflate.UseBudget(budget)
			buf := make([]byte, 32<<10)
			for i := range len(reads) + 2 {
				if i == len(reads)-1 && tc.clientGone {
					if strings.Contains(name, "proxy") {
						ws.stop()
					} else {
						cancel()
					}
				}
				if _, err := b.Read(buf); err != nil {
					break
				}
			}
			if got := ws.errorEvent.Load(); got != tc.wantError {
				t.Errorf("ERROR event seen %v, want %v", got, tc.wantError)
			}
			_ = b.Close()
			if b.inflate.HeldMember() != nil || budget.InUse() != 0 {
				t.Errorf("%d bytes still held, budget used %d", len(b.inflate.HeldMember()), budget.InUse())
			}
		})
	}
}

// A member held is released when the watch body closes before the stream
// ends (the client left mid-watch), and its bytes go back to the budget.
func TestGzipWatchBodyReleasesTheMemberHeldOnClose(t *testing.T) {
	reads := streamtest.MemberReads(t, streamtest.JSONFrames()[:1], streamtest.JSONFrames()[1:2], streamtest.JSONFrames()[1:2])
	ws := &Watch{engine: &enginetest.Engine{}, clock: clock.RealClock{}, c: &request.Classification{}, log: logtest.Discard(),
		clientCtx: t.Context(), cancel: func() {}}
	b := newWatchBody(ws, io.NopCloser(&streamtest.ChunkedReader{Reads: append(slices.Clone(reads), nil)}), streamtest.JSONWatchType, "gzip")
	budget := inspect.NewSharedBytes(1<<20, 1<<20)
	b.inflate.UseBudget(budget)
	buf := make([]byte, 32<<10)
	for range reads {
		if _, err := b.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	if len(b.inflate.HeldMember()) != len(reads[2]) || budget.InUse() != int64(cap(b.inflate.HeldMember())) {
		t.Fatalf("%d bytes held, budget used %d; want the last member, %d bytes, held and counted",
			len(b.inflate.HeldMember()), budget.InUse(), len(reads[2]))
	}
	if cap(b.inflate.HeldMember()) > 4*len(reads[2]) {
		t.Errorf("a %d-byte member held in a buffer of %d", len(reads[2]), cap(b.inflate.HeldMember()))
	}
	_ = b.Close()
	if b.inflate.HeldMember() != nil || budget.InUse() != 0 {
		t.Errorf("after Close: %d bytes held, budget used %d", len(b.inflate.HeldMember()), budget.InUse())
	}
}

// A gzip watch's held member is charged to the caller the watch belongs
// to.
func TestGzipWatchHoldsOnItsCallersShare(t *testing.T) {
	ctx := callertest.WithCaller(t.Context(), &user.DefaultInfo{Name: "mallory"})
	ws := &Watch{engine: &enginetest.Engine{}, clock: clock.RealClock{}, c: &request.Classification{}, log: logtest.Discard(),
		clientCtx: ctx, cancel: func() {}}
	b := newWatchBody(ws, io.NopCloser(strings.NewReader("")), streamtest.JSONWatchType, "gzip")
	if b.inflate == nil || b.inflate.ChargedTo() != "mallory" {
		t.Fatalf("gzip inspector of mallory's watch charges %q", b.inflate.ChargedTo())
	}
}

// errorCodes records the code of each ERROR event's Status an inspector
// reports.
type errorCodes struct{ errors []int32 }

func (s *errorCodes) SawEvent() {}
func (s *errorCodes) SawError(obj k8sruntime.Object) {
	s.errors = append(s.errors, streamtest.StatusCode(obj, nil))
}

// inspectAll feeds data to a new inspector in chunks of chunk bytes and
// returns the ERROR events it reported.
func inspectAll(t testing.TB, contentType string, data []byte, chunk int) *errorCodes {
	f, s, _, ok := inspect.FramingFor(contentType, "")
	if !ok {
		t.Fatalf("no framing for %s", contentType)
	}
	sink := &errorCodes{}
	in := inspect.NewStream(f, s, sink)
	for len(data) > 0 {
		n := min(len(data), max(1, chunk))
		in.Write(data[:n])
		data = data[n:]
	}
	in.Release()
	return sink
}
