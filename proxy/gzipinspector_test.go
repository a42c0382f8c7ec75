package proxy

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

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
	g := newGzipInspector(newStreamInspector(f, s, sink))
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

// The inspector of a gzip stream sees every event and finds the same
// ERROR events as the full decode of the inflated stream, however the
// members are cut into reads: one member per event, many events per
// member, members cut anywhere, in JSON and protobuf.
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
				if g.off || !slices.Equal(sink.errors, wantErrors) || sink.events != wantSink.events {
					t.Errorf("chunks %v: off=%v, errors %v events %d; want errors %v events %d", chunks, g.off,
						sink.errors, sink.events, wantErrors, wantSink.events)
				}
				if g.pending != nil {
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
	var members [][][]byte
	for _, f := range longStream {
		members = append(members, [][]byte{f})
	}
	for name, tc := range map[string]struct {
		data        []byte
		maxInflated int64
	}{
		"a gzip bomb (64 MiB of zeros)":       {bomb, maxInflatedBytesPerRead + 64<<10},
		"a stream over the per-stream budget": {gzipMembers(t, members...), MaxInflatedBytesPerStream + 64<<10},
		"not gzip":                            {[]byte(strings.Repeat(string(jsonFrames()[0]), 10)), 0},
		"a corrupt member after a good one":   {append(gzipMembers(t, jsonFrames()[:1]), 0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff), 64 << 10},
		"a member past the compressed budget": {gzipMembers(t, [][]byte{randomText(2 * maxPendingGzipBytes)}), 3 * maxPendingGzipBytes},
	} {
		t.Run(name, func(t *testing.T) {
			for _, chunks := range [][]int{{32 << 10}, {1 << 20}} {
				_, g := inspectGzip(t, jsonWatchType, tc.data, chunks)
				if !g.off {
					t.Errorf("chunks %v: inspection went on", chunks)
				}
				if g.pending != nil {
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
