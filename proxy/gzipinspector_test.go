package proxy

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/ratelimit"
)

// gzipMembers encodes groups of frames as kube-apiserver encodes a
// watch-list for a client that accepts gzip: one gzip member (level 1,
// flushed then closed) per flush, here per group.
func gzipMembers(t testing.TB, groups ...[][]byte) []byte {
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

// inspectGzip feeds a gzip stream to a new gzipInspector in chunks of the
// given sizes (cycled), ends it, and returns what the inspector reported.
func inspectGzip(t testing.TB, contentType string, data []byte, chunks []int) (*recordingSink, *gzipInspector) {
	t.Helper()
	f, s, gzipped, ok := streamFramingFor(contentType, "gzip")
	if !ok || !gzipped {
		t.Fatalf("no gzip framing for %s", contentType)
	}
	sink := &recordingSink{}
	g := newGzipInspector(newStreamInspector(f, s, sink), "alice")
	for i := 0; len(data) > 0; i++ {
		n := len(data)
		if len(chunks) > 0 {
			n = min(n, max(1, chunks[i%len(chunks)]))
		}
		g.write(data[:n])
		data = data[n:]
	}
	g.finish()
	return sink, g
}

// manyEvents returns n JSON ADDED events of about 300 bytes, then an ERROR
// 410.
func manyEvents(n int) [][]byte {
	frames := make([][]byte, 0, n+1)
	for i := range n {
		frames = append(frames, fmt.Appendf(nil, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-%d","namespace":"ns","resourceVersion":"%d"},"data":{"k":"%s"}}}`+"\n",
			i, 100+i, strings.Repeat(fmt.Sprint(i%10), 200)))
	}
	return append(frames, jsonFrames()[2])
}

// The inspector of a gzip stream finds the same ERROR events as the full
// decode of the inflated stream, however the members are cut into reads:
// one member per event, many events per member, members cut anywhere, in
// JSON and protobuf. It sees the first event, and the events of members
// that ended before the first event or that end the stream; those of
// members followed by more data may go unseen.
func TestGzipInspectorFindsErrorEventsWhereverReadsCut(t *testing.T) {
	pb := protobufFrames(t)
	events := manyEvents(300)
	for name, tc := range map[string]struct {
		contentType string
		groups      [][][]byte
	}{
		"json, a member per event":     {jsonWatchType, [][][]byte{jsonFrames()[:1], jsonFrames()[1:2], jsonFrames()[2:]}},
		"json, one member":             {jsonWatchType, [][][]byte{jsonFrames()}},
		"json, large members":          {jsonWatchType, [][][]byte{events[:150], events[150:299], events[299:]}},
		"json, an ERROR inside":        {jsonWatchType, [][][]byte{{jsonFrames()[2], jsonFrames()[0]}}},
		"protobuf, a member per event": {protobufWatchType, [][][]byte{pb[:1], pb[1:2], pb[2:]}},
		"protobuf, one member":         {protobufWatchType, [][][]byte{pb}},
	} {
		t.Run(name, func(t *testing.T) {
			var plain []byte
			for _, g := range tc.groups {
				plain = append(plain, bytes.Join(g, nil)...)
			}
			wantErrors, _ := referenceErrors(t, tc.contentType, plain)
			wantSink, _ := inspect(t, tc.contentType, plain, nil)
			data := gzipMembers(t, tc.groups...)
			for _, chunks := range [][]int{nil, {1}, {7, 13}, {100}, {4096}, {32 << 10}} {
				sink, g := inspectGzip(t, tc.contentType, data, chunks)
				if g.off || !slices.Equal(sink.errors, wantErrors) || sink.events < 1 || sink.events > wantSink.events {
					t.Errorf("chunks %v: off=%v, errors %v events %d; want errors %v events 1 to %d", chunks, g.off,
						sink.errors, sink.events, wantErrors, wantSink.events)
				}
				if g.pending != nil || g.held != nil {
					t.Errorf("chunks %v: compressed bytes still held after the stream ended", chunks)
				}
				// A member cut by reads is inflated again, but at most
				// about twice over in all (and more only for reads of a
				// few bytes, where each try is small).
				if len(chunks) > 0 && chunks[0] >= 100 && g.inflated > 3*int64(len(plain))+64<<10 {
					t.Errorf("chunks %v: inflated %d bytes for a stream of %d", chunks, g.inflated, len(plain))
				}
			}
		})
	}
}

// What cannot be inspected within the bounds is let go: a gzip bomb, a
// stream over the per-stream budget, bytes that are not gzip. Inspection
// stops, nothing is held, nothing panics.
func TestGzipInspectorStopsAtItsBounds(t *testing.T) {
	bomb := gzipMembers(t, [][]byte{make([]byte, 64<<20)})
	longStream := make([][]byte, 0, MaxInflatedBytesPerStream/(1<<20)+2)
	for range cap(longStream) {
		longStream = append(longStream, bytes.Repeat(jsonFrames()[0], (1<<20)/len(jsonFrames()[0])))
	}
	// Members that cut frames: the inspector is never at a frame start at
	// a member end, so every member is inflated.
	var members [][][]byte
	for i, f := range longStream {
		if i == 0 {
			members = append(members, [][]byte{f[:len(f)-7]})
			continue
		}
		members = append(members, [][]byte{longStream[i-1][len(f)-7:], f[:len(f)-7]})
	}
	goodThenBadCRC := gzipMembers(t, jsonFrames()[:1], jsonFrames()[1:2])
	goodThenBadCRC[len(goodThenBadCRC)-5] ^= 1
	for name, tc := range map[string]struct {
		data        []byte
		maxInflated int64
	}{
		"a gzip bomb (64 MiB of zeros)":       {bomb, maxInflatedBytesPerRead + 64<<10},
		"a stream over the per-stream budget": {gzipMembers(t, members...), MaxInflatedBytesPerStream + 64<<10},
		"not gzip":                            {[]byte(strings.Repeat(string(jsonFrames()[0]), 10)), 0},
		"a corrupt member after a good one":   {append(gzipMembers(t, [][]byte{jsonFrames()[0][:20]}), 0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff), 64 << 10},
		"a last member with a wrong CRC-32":   {goodThenBadCRC, 64 << 10},
		"a member past the compressed budget": {gzipMembers(t, [][]byte{randomText(2 * maxPendingGzipBytes)}), 3 * maxPendingGzipBytes},
	} {
		t.Run(name, func(t *testing.T) {
			for _, chunks := range [][]int{{32 << 10}, {1 << 20}} {
				_, g := inspectGzip(t, jsonWatchType, tc.data, chunks)
				if !g.off {
					t.Errorf("chunks %v: inspection went on", chunks)
				}
				if g.pending != nil || g.held != nil {
					t.Errorf("chunks %v: compressed bytes still held", chunks)
				}
				if g.inflated > tc.maxInflated {
					t.Errorf("chunks %v: inflated %d bytes, want at most %d", chunks, g.inflated, tc.maxInflated)
				}
			}
		})
	}
}

// randomText is n bytes of JSON-safe text that gzip cannot shrink much.
func randomText(n int) []byte {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = 'a' + byte(x%26)
	}
	return append(append([]byte(`"`), b...), '"')
}

// gzipUpstream answers a watch as kube-apiserver answers a watch-list to a
// client that accepts gzip, a member per flush, one flush at a time (see
// streamingUpstream).
func gzipUpstream(t *testing.T, contentType string, members [][]byte, proceed <-chan struct{}) http.Handler {
	h := streamingUpstream(t, contentType, members, proceed)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Add("Vary", "Accept-Encoding")
		h.ServeHTTP(w, r)
	})
}

// A watch-list answered with gzip (kube-apiserver's WatchListCompression)
// passes byte for byte, each member as it comes, and its ERROR 410 is
// seen: the engine learns the version and the watch ends as an error.
func TestGzipWatchStreamLearnsStaleVersions(t *testing.T) {
	for name, tc := range map[string]struct {
		contentType string
		frames      [][]byte
	}{
		"json":     {jsonWatchType, jsonFrames()},
		"protobuf": {protobufWatchType, protobufFrames(t)},
	} {
		t.Run(name, func(t *testing.T) {
			members := make([][]byte, len(tc.frames))
			for i, f := range tc.frames {
				members[i] = gzipMembers(t, [][]byte{f})
			}
			engine := &fakeEngine{}
			proceed := make(chan struct{})
			px := newTestProxy(t, engine, gzipUpstream(t, tc.contentType, members, proceed))
			// The client reads the encoded bytes as they come (no
			// transparent decompression).
			client := px.Client()
			client.Transport.(*http.Transport).DisableCompression = true
			req, _ := http.NewRequest(http.MethodGet, px.URL+staleWatchURL+"&sendInitialEvents=false&resourceVersionMatch=NotOlderThan", nil)
			req.Header.Set("Authorization", "Bearer alice")
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ce := resp.Header.Get("Content-Encoding"); ce != "gzip" {
				t.Fatalf("Content-Encoding %q, want gzip passed through", ce)
			}
			var got []byte
			for i, m := range members {
				buf := make([]byte, len(m))
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					t.Fatalf("member %d: %v", i, err)
				}
				got = append(got, buf...)
				if i < len(members)-1 {
					proceed <- struct{}{}
				}
			}
			rest, _ := io.ReadAll(resp.Body)
			if want := bytes.Join(members, nil); !bytes.Equal(append(got, rest...), want) {
				t.Errorf("client got %d bytes, want the upstream's %d bytes unchanged", len(got)+len(rest), len(want))
			}
			ended := engine.waitEnded(t, 1)
			_, _, stale := engine.snapshot()
			if !slices.Equal(stale, []string{"/configmaps@42"}) || !slices.Equal(ended, []ratelimit.Outcome{ratelimit.OutcomeError}) {
				t.Errorf("stale %v, ended %v; want [/configmaps@42], [error]", stale, ended)
			}
		})
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
		{jsonWatchType, "br"},
		{jsonWatchType, "deflate"},
	} {
		b := newWatchBody(&watchState{}, io.NopCloser(strings.NewReader("")), tc.contentType, tc.encoding)
		if b.inspect != nil || b.inflate != nil {
			t.Errorf("%s encoded %q: inspected", tc.contentType, tc.encoding)
		}
	}
	for _, encoding := range []string{"gzip", "GZIP"} {
		if b := newWatchBody(&watchState{}, io.NopCloser(strings.NewReader("")), jsonWatchType, encoding); b.inflate == nil {
			t.Errorf("JSON encoded %q: not inflated", encoding)
		}
	}
	if b := newWatchBody(&watchState{}, io.NopCloser(strings.NewReader("")), jsonWatchType, ""); b.inflate != nil {
		t.Error("an identity stream has an inflater")
	}
}

// memberReads encodes each group of frames as one gzip member, as
// kube-apiserver flushes them, and returns one read per member.
func memberReads(t testing.TB, groups ...[][]byte) [][]byte {
	t.Helper()
	reads := make([][]byte, len(groups))
	for i, g := range groups {
		reads[i] = gzipMembers(t, g)
	}
	return reads
}

// newTestGzipInspector is a gzipInspector for contentType with a budget of
// its own.
func newTestGzipInspector(t testing.TB, contentType string, budget int64) (*gzipInspector, *recordingSink) {
	t.Helper()
	f, s, _, ok := streamFramingFor(contentType, "gzip")
	if !ok {
		t.Fatalf("no framing for %s", contentType)
	}
	sink := &recordingSink{}
	g := newGzipInspector(newStreamInspector(f, s, sink), "alice")
	g.budget = newSharedBytes(budget, budget)
	return g, sink
}

// bytesOf is the total length of frames.
func bytesOf(frames ...[]byte) int64 {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	return int64(n)
}

// After its first frame, the inspector inflates only the member that ends
// the stream: members followed by more data pass uninflated, and an ERROR
// in the last member is seen, whether the last member comes in one read
// or cut into many, in JSON and protobuf. An ERROR in the first member is
// seen as before.
func TestGzipInspectorInflatesOnlyTheFirstAndLastMembers(t *testing.T) {
	events := manyEvents(300) // 300 ADDED, then an ERROR 410
	pb := protobufFrames(t)   // ADDED, MODIFIED, ERROR 410
	var pbEvents [][]byte
	for range 100 {
		pbEvents = append(pbEvents, pb[0], pb[1])
	}
	pbEvents = append(pbEvents, pb[2])
	for name, tc := range map[string]struct {
		contentType string
		frames      [][]byte
	}{
		"json":     {jsonWatchType, events},
		"protobuf": {protobufWatchType, pbEvents},
	} {
		groups := make([][][]byte, len(tc.frames))
		for i, f := range tc.frames {
			groups[i] = [][]byte{f}
		}
		reads := memberReads(t, groups...)
		last := tc.frames[len(tc.frames)-1]
		// The first member and the last, once each.
		maxInflated := bytesOf(tc.frames[0]) + bytesOf(last)
		for _, lastChunk := range []int{0, 1, 7, 100} {
			t.Run(fmt.Sprintf("%s, the last member in reads of %d bytes", name, lastChunk), func(t *testing.T) {
				g, sink := newTestGzipInspector(t, tc.contentType, 1<<20)
				skipped := counterValue(t, gzipSkippedBytes)
				for _, r := range reads[:len(reads)-1] {
					g.write(r)
				}
				if !g.deferring || len(g.held) == 0 {
					t.Fatalf("deferring %v, %d bytes held; want the last member held", g.deferring, len(g.held))
				}
				for r := reads[len(reads)-1]; len(r) > 0; {
					n := len(r)
					if lastChunk > 0 {
						n = min(n, lastChunk)
					}
					g.write(r[:n])
					r = r[n:]
				}
				g.finish()
				if g.off || !slices.Equal(sink.errors, []int32{410}) || sink.events != 1 {
					t.Errorf("off %v, errors %v, events %d; want [410] and the first event", g.off, sink.errors, sink.events)
				}
				// Counters are shared with the package's other tests,
				// which run one at a time.
				if got, want := counterValue(t, gzipSkippedBytes)-skipped, bytesOf(reads[1:len(reads)-1]...); got != float64(want) {
					t.Errorf("%v compressed bytes counted as skipped, want the middle members' %d", got, want)
				}
				if g.inflated > maxInflated {
					t.Errorf("inflated %d bytes; want at most %d (the first member and the last)", g.inflated, maxInflated)
				}
				if g.held != nil || g.pending != nil || g.budget.inUse() != 0 {
					t.Errorf("held %d, pending %v, budget used %d after the end", len(g.held), g.pending != nil, g.budget.inUse())
				}
			})
		}
	}
	t.Run("an ERROR in the first member", func(t *testing.T) {
		g, sink := newTestGzipInspector(t, jsonWatchType, 1<<20)
		for _, r := range memberReads(t, jsonFrames()[2:], jsonFrames()[:1], jsonFrames()[1:2]) {
			g.write(r)
		}
		g.finish()
		if !slices.Equal(sink.errors, []int32{410}) {
			t.Errorf("errors %v, want [410]", sink.errors)
		}
	})
	t.Run("members that cut frames are all inflated", func(t *testing.T) {
		// Not kube-apiserver's way: the inspector is never at a frame
		// start at a member end, so it never defers.
		plain := bytes.Join(events, nil)
		var groups [][][]byte
		for i := 0; i < len(plain); i += 1000 {
			groups = append(groups, [][]byte{plain[i:min(len(plain), i+1000)]})
		}
		g, sink := newTestGzipInspector(t, jsonWatchType, 1<<20)
		for _, r := range memberReads(t, groups...) {
			g.write(r)
		}
		g.finish()
		if !slices.Equal(sink.errors, []int32{410}) || sink.events != 300 {
			t.Errorf("errors %v, events %d; want every member inflated", sink.errors, sink.events)
		}
	})
}

// chunkedReader returns its reads one per Read, the last with end (nil:
// io.EOF in a Read of its own).
type chunkedReader struct {
	reads [][]byte
	end   error
	last  bool // the end comes with the last bytes
}

func (r *chunkedReader) Read(p []byte) (int, error) {
	if len(r.reads) == 0 {
		if r.end != nil {
			return 0, r.end
		}
		return 0, io.EOF
	}
	n := copy(p, r.reads[0])
	if r.reads[0] = r.reads[0][n:]; len(r.reads[0]) == 0 {
		r.reads = r.reads[1:]
	}
	if len(r.reads) == 0 && r.last {
		if r.end != nil {
			return n, r.end
		}
		return n, io.EOF
	}
	return n, nil
}

// How the stream ends does not matter: the ERROR in the member held is
// seen when EOF comes with the last bytes or alone, and when a read error
// cuts the stream after it. When the client left or the proxy closed the
// watch, what is held is dropped uninflated.
func TestGzipWatchBodyInflatesTheMemberHeldAtTheEnd(t *testing.T) {
	reads := memberReads(t, jsonFrames()[:1], jsonFrames()[1:2], jsonFrames()[1:2], jsonFrames()[2:])
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
			ws := &watchState{engine: &fakeEngine{}, clock: clock.RealClock{}, c: &classification{ResourceVersion: "42"},
				log: discardLogs(), clientCtx: ctx, cancel: cancel}
			src := &chunkedReader{reads: slices.Clone(reads), end: tc.end, last: tc.last}
			b := newWatchBody(ws, io.NopCloser(src), jsonWatchType, "gzip")
			budget := newSharedBytes(1<<20, 1<<20)
			b.inflate.budget = budget
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
			if b.inflate.held != nil || budget.inUse() != 0 {
				t.Errorf("%d bytes still held, budget used %d", len(b.inflate.held), budget.inUse())
			}
		})
	}
}

// A member held is released when the watch body closes before the stream
// ends (the client left mid-watch), and its bytes go back to the budget.
func TestGzipWatchBodyReleasesTheMemberHeldOnClose(t *testing.T) {
	reads := memberReads(t, jsonFrames()[:1], jsonFrames()[1:2], jsonFrames()[1:2])
	ws := &watchState{engine: &fakeEngine{}, clock: clock.RealClock{}, c: &classification{}, log: discardLogs(),
		clientCtx: t.Context(), cancel: func() {}}
	b := newWatchBody(ws, io.NopCloser(&chunkedReader{reads: append(slices.Clone(reads), nil)}), jsonWatchType, "gzip")
	budget := newSharedBytes(1<<20, 1<<20)
	b.inflate.budget = budget
	buf := make([]byte, 32<<10)
	for range reads {
		if _, err := b.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	if len(b.inflate.held) != len(reads[2]) || budget.inUse() != int64(cap(b.inflate.held)) {
		t.Fatalf("%d bytes held, budget used %d; want the last member, %d bytes, held and counted",
			len(b.inflate.held), budget.inUse(), len(reads[2]))
	}
	if cap(b.inflate.held) > 4*len(reads[2]) {
		t.Errorf("a %d-byte member held in a buffer of %d", len(reads[2]), cap(b.inflate.held))
	}
	_ = b.Close()
	if b.inflate.held != nil || budget.inUse() != 0 {
		t.Errorf("after Close: %d bytes held, budget used %d", len(b.inflate.held), budget.inUse())
	}
}

// Past the budget shared by all streams, or for a member larger than one
// stream may hold, a member is inflated at once, and ERROR events are
// still found.
func TestGzipInspectorInflatesAtOncePastItsHoldingBounds(t *testing.T) {
	event := func(value []byte) []byte {
		return append(append([]byte(`{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","data":{"k":`), value...), "}}}\n"...)
	}
	bigEvent, hugeEvent := event(randomText(2*maxHeldGzipBytes)), event(randomText(2*maxCollectedBytes))
	for name, tc := range map[string]struct {
		budget int64
		groups [][][]byte
	}{
		"the shared budget spent":                           {0, [][][]byte{jsonFrames()[:1], jsonFrames()[1:2], jsonFrames()[1:2], jsonFrames()[2:]}},
		"a member over the stream's cap":                    {1 << 20, [][][]byte{jsonFrames()[:1], {bigEvent}, jsonFrames()[2:]}},
		"a member too large to keep inflated while checked": {1 << 20, [][][]byte{jsonFrames()[:1], {hugeEvent}, jsonFrames()[2:]}},
	} {
		t.Run(name, func(t *testing.T) {
			reads := memberReads(t, tc.groups...)
			g, sink := newTestGzipInspector(t, jsonWatchType, tc.budget)
			for i, r := range reads {
				before := g.inflated
				g.write(r)
				if i > 0 && i < len(reads)-1 && g.inflated == before {
					t.Errorf("member %d not inflated at once", i)
				}
				if (tc.budget == 0 || i == 1) && len(g.held) > 0 || g.budget.inUse() > tc.budget {
					t.Errorf("member %d: %d bytes held, budget used %d", i, len(g.held), g.budget.inUse())
				}
			}
			g.finish()
			if g.off || !slices.Equal(sink.errors, []int32{410}) || sink.events != len(reads)-1 {
				t.Errorf("off %v, errors %v, events %d; want [410] and every member's event", g.off, sink.errors, sink.events)
			}
		})
	}
}

// A tenant's object bytes in a protobuf stream pass raw through deflate
// when they do not compress (stored blocks), so a tenant can plant what
// looks like a member end followed by a whole gzip member that holds an
// ERROR 410. The proxy must not see that ERROR, wherever the look-alike
// lies: in a member followed by more, in the last member, at the end of
// the object's bytes, or ending where a read ends.
func TestGzipInspectorSeesNoPlantedMember(t *testing.T) {
	pb := protobufFrames(t)
	fake := gzipMembers(t, pb[2:]) // a whole member holding an ERROR 410
	lookAlike := func(tail []byte) []byte {
		var b []byte
		b = append(b, randomBytes(3000, 1)...)
		b = append(b, gzipMemberEnd...)
		b = append(b, 1, 2, 3, 4, 5, 6, 7, 8) // a CRC-32 and size
		b = append(b, fake...)
		return append(b, tail...)
	}
	event := func(raw []byte) []byte {
		ev := metav1.WatchEvent{Type: string(watch.Added), Object: k8sruntime.RawExtension{Raw: raw}}
		payload, err := ev.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return lengthPrefixed(payload)
	}
	inside, atEnd := event(lookAlike(randomBytes(2000, 2))), event(lookAlike(nil))
	for name, tc := range map[string]struct {
		groups   [][][]byte
		cutRead  bool // a read ends right after the look-alike
		lastHeld bool // the look-alike is in the stream's last member
	}{
		"in a member followed by more":           {groups: [][][]byte{pb[:1], {inside}, pb[1:2]}},
		"in the last member":                     {groups: [][][]byte{pb[:1], pb[1:2], {inside}}, lastHeld: true},
		"at the end of the last member's object": {groups: [][][]byte{pb[:1], pb[1:2], {atEnd}}, lastHeld: true},
		"ending where a read ends":               {groups: [][][]byte{pb[:1], pb[1:2], {inside}, pb[1:2]}, cutRead: true},
	} {
		t.Run(name, func(t *testing.T) {
			reads := memberReads(t, tc.groups...)
			planted := slices.IndexFunc(reads, func(r []byte) bool { return bytes.Contains(r, fake) })
			if planted < 1 {
				t.Fatal("no member holds the look-alike member raw")
			}
			if tc.cutRead {
				i := bytes.Index(reads[planted], fake) + len(fake)
				reads = slices.Insert(reads, planted, reads[planted][:i])
				reads[planted+1] = reads[planted+1][i:]
			}
			g, sink := newTestGzipInspector(t, protobufWatchType, 1<<20)
			unverified := counterValue(t, gzipInspectionsStopped.WithLabelValues(stopUnverified))
			for _, r := range reads {
				g.write(r)
			}
			g.finish()
			if got := counterValue(t, gzipInspectionsStopped.WithLabelValues(stopUnverified)) - unverified; got != 0 != tc.lastHeld {
				t.Errorf("%v inspections counted as stopped unverified", got)
			}
			if len(sink.errors) > 0 {
				t.Fatalf("saw ERROR events %v planted in an object", sink.errors)
			}
			// A look-alike in the last member is where that member seems
			// to start: it fails the check, and inspection stops.
			if g.off != tc.lastHeld {
				t.Errorf("inspection stopped %v, want %v", g.off, tc.lastHeld)
			}
		})
	}
}

// randomBytes is n bytes that deflate cannot shrink, from seed.
func randomBytes(n int, seed uint32) []byte {
	b := make([]byte, n)
	x := 2463534242 + seed
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x >> 7)
	}
	return b
}

// TestLastMemberEndSearchesOnlyWhereAnEndCanBe checks lastMemberEnd, which
// searches only the bytes that can hold an end after from, against the
// definition tried at every offset of b, over random streams thick with
// member ends and magics.
func TestLastMemberEndSearchesOnlyWhereAnEndCanBe(t *testing.T) {
	// whole is the largest end after from of a gzipMemberEnd and 8 bytes
	// that b ends at, or that the next member's magic (or its first byte,
	// at b's end) follows.
	whole := func(b []byte, from int) int {
		best := 0
		for i := 0; i+len(gzipMemberEnd) <= len(b); i++ {
			end := i + len(gzipMemberEnd) + 8
			if !bytes.HasPrefix(b[i:], gzipMemberEnd) || end <= from || end > len(b) {
				continue
			}
			if rest := b[end:]; bytes.HasPrefix(rest, gzipMagic) || len(rest) < len(gzipMagic) && bytes.HasPrefix(gzipMagic, rest) {
				best = end
			}
		}
		return best
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := [][]byte{gzipMemberEnd, gzipMagic, {0x00}, {0xff}, {0x1f}, {0x8b}, {0x01, 0x00}}
	found := 0
	for range 20000 {
		var b []byte
		for len(b) < 1+rng.IntN(80) {
			b = append(b, pieces[rng.IntN(len(pieces))]...)
		}
		from := rng.IntN(len(b) + 1)
		want := whole(b, from)
		if got := lastMemberEnd(b, from); got != want {
			t.Fatalf("lastMemberEnd(% x, %d) = %d, a search of all of it says %d", b, from, got, want)
		}
		if want > 0 {
			found++
		}
	}
	if found < 1000 {
		t.Errorf("only %d of the streams held a member end after from; the check proves little", found)
	}
}
