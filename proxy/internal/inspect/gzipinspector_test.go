package inspect

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/watchgate/watchgate/proxy/internal/metricstest"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
)

// inspectGzip feeds a gzip stream to a new Gzip in chunks of the
// given sizes (cycled), ends it, and returns what the inspector reported.
func inspectGzip(t testing.TB, contentType string, data []byte, chunks []int) (*recordingSink, *Gzip) {
	t.Helper()
	f, s, gzipped, ok := FramingFor(contentType, "gzip")
	if !ok || !gzipped {
		t.Fatalf("no gzip framing for %s", contentType)
	}
	sink := &recordingSink{}
	g := NewGzip(NewStream(f, s, sink), "alice")
	for i := 0; len(data) > 0; i++ {
		n := len(data)
		if len(chunks) > 0 {
			n = min(n, max(1, chunks[i%len(chunks)]))
		}
		g.Write(data[:n])
		data = data[n:]
	}
	g.Finish()
	return sink, g
}

// The inspector of a gzip stream finds the same ERROR events as the full
// decode of the inflated stream, however the members are cut into reads:
// one member per event, many events per member, members cut anywhere, in
// JSON and protobuf. It sees the first event, and the events of members
// that ended before the first event or that end the stream; those of
// members followed by more data may go unseen.
func TestGzipInspectorFindsErrorEventsWhereverReadsCut(t *testing.T) {
	pb := streamtest.ProtobufFrames(t)
	events := streamtest.ManyEvents(300)
	for name, tc := range map[string]struct {
		contentType string
		groups      [][][]byte
	}{
		"json, a member per event":     {streamtest.JSONWatchType, [][][]byte{streamtest.JSONFrames()[:1], streamtest.JSONFrames()[1:2], streamtest.JSONFrames()[2:]}},
		"json, one member":             {streamtest.JSONWatchType, [][][]byte{streamtest.JSONFrames()}},
		"json, large members":          {streamtest.JSONWatchType, [][][]byte{events[:150], events[150:299], events[299:]}},
		"json, an ERROR inside":        {streamtest.JSONWatchType, [][][]byte{{streamtest.JSONFrames()[2], streamtest.JSONFrames()[0]}}},
		"protobuf, a member per event": {streamtest.ProtobufWatchType, [][][]byte{pb[:1], pb[1:2], pb[2:]}},
		"protobuf, one member":         {streamtest.ProtobufWatchType, [][][]byte{pb}},
	} {
		t.Run(name, func(t *testing.T) {
			var plain []byte
			for _, g := range tc.groups {
				plain = append(plain, bytes.Join(g, nil)...)
			}
			wantErrors, _ := streamtest.ReferenceErrors(t, tc.contentType, plain)
			wantSink, _ := inspect(t, tc.contentType, plain, nil)
			data := streamtest.GzipMembers(t, tc.groups...)
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
	bomb := streamtest.GzipMembers(t, [][]byte{make([]byte, 64<<20)})
	longStream := make([][]byte, 0, MaxInflatedBytesPerStream/maxWholeFirstBytes*11/10)
	for range cap(longStream) {
		longStream = append(longStream, bytes.Repeat(streamtest.JSONFrames()[0], maxWholeFirstBytes/len(streamtest.JSONFrames()[0])))
	}
	// Members that cut frames, each small enough to be inflated whole
	// before deferring: the inspector is never at a frame start at a
	// member end, so every member is inflated.
	var members [][][]byte
	for i, f := range longStream {
		if i == 0 {
			members = append(members, [][]byte{f[:len(f)-7]})
			continue
		}
		members = append(members, [][]byte{longStream[i-1][len(f)-7:], f[:len(f)-7]})
	}
	goodThenBadCRC := streamtest.GzipMembers(t, streamtest.JSONFrames()[:1], streamtest.JSONFrames()[1:2])
	goodThenBadCRC[len(goodThenBadCRC)-5] ^= 1
	for name, tc := range map[string]struct {
		data        []byte
		maxInflated int64
	}{
		"a gzip bomb (64 MiB of zeros)":       {bomb, maxInflatedBytesPerRead + 64<<10},
		"a stream over the per-stream budget": {streamtest.GzipMembers(t, members...), MaxInflatedBytesPerStream + 64<<10},
		"not gzip":                            {[]byte(strings.Repeat(string(streamtest.JSONFrames()[0]), 10)), 0},
		"a corrupt member after a good one":   {append(streamtest.GzipMembers(t, [][]byte{streamtest.JSONFrames()[0][:20]}), 0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff), 64 << 10},
		"a last member with a wrong CRC-32":   {goodThenBadCRC, 64 << 10},
		"a member past the compressed budget": {streamtest.GzipMembers(t, [][]byte{randomText(2 * maxPendingGzipBytes)}), 3 * maxPendingGzipBytes},
	} {
		t.Run(name, func(t *testing.T) {
			for _, chunks := range [][]int{{32 << 10}, {1 << 20}} {
				_, g := inspectGzip(t, streamtest.JSONWatchType, tc.data, chunks)
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

// newTestGzipInspector is a Gzip for contentType with a budget of
// its own.
func newTestGzipInspector(t testing.TB, contentType string, budget int64) (*Gzip, *recordingSink) {
	t.Helper()
	f, s, _, ok := FramingFor(contentType, "gzip")
	if !ok {
		t.Fatalf("no framing for %s", contentType)
	}
	sink := &recordingSink{}
	g := NewGzip(NewStream(f, s, sink), "alice")
	g.budget = NewSharedBytes(budget, budget)
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
	events := streamtest.ManyEvents(300) // 300 ADDED, then an ERROR 410
	pb := streamtest.ProtobufFrames(t)   // ADDED, MODIFIED, ERROR 410
	var pbEvents [][]byte
	for range 100 {
		pbEvents = append(pbEvents, pb[0], pb[1])
	}
	pbEvents = append(pbEvents, pb[2])
	for name, tc := range map[string]struct {
		contentType string
		frames      [][]byte
	}{
		"json":     {streamtest.JSONWatchType, events},
		"protobuf": {streamtest.ProtobufWatchType, pbEvents},
	} {
		groups := make([][][]byte, len(tc.frames))
		for i, f := range tc.frames {
			groups[i] = [][]byte{f}
		}
		reads := streamtest.MemberReads(t, groups...)
		last := tc.frames[len(tc.frames)-1]
		// The first member and the last, once each.
		maxInflated := bytesOf(tc.frames[0]) + bytesOf(last)
		for _, lastChunk := range []int{0, 1, 7, 100} {
			t.Run(fmt.Sprintf("%s, the last member in reads of %d bytes", name, lastChunk), func(t *testing.T) {
				g, sink := newTestGzipInspector(t, tc.contentType, 1<<20)
				skipped := metricstest.CounterValue(t, gzipSkippedBytes)
				for _, r := range reads[:len(reads)-1] {
					g.Write(r)
				}
				if !g.deferring || len(g.held) == 0 {
					t.Fatalf("deferring %v, %d bytes held; want the last member held", g.deferring, len(g.held))
				}
				for r := reads[len(reads)-1]; len(r) > 0; {
					n := len(r)
					if lastChunk > 0 {
						n = min(n, lastChunk)
					}
					g.Write(r[:n])
					r = r[n:]
				}
				g.Finish()
				if g.off || !slices.Equal(sink.errors, []int32{410}) || sink.events != 1 {
					t.Errorf("off %v, errors %v, events %d; want [410] and the first event", g.off, sink.errors, sink.events)
				}
				// Counters are shared with the package's other tests,
				// which run one at a time.
				if got, want := metricstest.CounterValue(t, gzipSkippedBytes)-skipped, bytesOf(reads[1:len(reads)-1]...); got != float64(want) {
					t.Errorf("%v compressed bytes counted as skipped, want the middle members' %d", got, want)
				}
				if g.inflated > maxInflated {
					t.Errorf("inflated %d bytes; want at most %d (the first member and the last)", g.inflated, maxInflated)
				}
				if g.held != nil || g.pending != nil || g.budget.InUse() != 0 {
					t.Errorf("held %d, pending %v, budget used %d after the end", len(g.held), g.pending != nil, g.budget.InUse())
				}
			})
		}
	}
	t.Run("an ERROR in the first member", func(t *testing.T) {
		g, sink := newTestGzipInspector(t, streamtest.JSONWatchType, 1<<20)
		for _, r := range streamtest.MemberReads(t, streamtest.JSONFrames()[2:], streamtest.JSONFrames()[:1], streamtest.JSONFrames()[1:2]) {
			g.Write(r)
		}
		g.Finish()
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
		g, sink := newTestGzipInspector(t, streamtest.JSONWatchType, 1<<20)
		for _, r := range streamtest.MemberReads(t, groups...) {
			g.Write(r)
		}
		g.Finish()
		if !slices.Equal(sink.errors, []int32{410}) || sink.events != 300 {
			t.Errorf("errors %v, events %d; want every member inflated", sink.errors, sink.events)
		}
	})
}

// A member followed in its read by the start of the next is dropped at
// once: while deferring, only a read that ends at a member end leaves a
// member held. The ERROR in the last member is found all the same, and a
// stream cut inside a member leaves nothing held.
func TestGzipInspectorHoldsOnlyAMemberThatEndsItsRead(t *testing.T) {
	events := streamtest.ManyEvents(300) // 300 ADDED, then an ERROR 410
	groups := make([][][]byte, len(events))
	for i, f := range events {
		groups[i] = [][]byte{f}
	}
	reads := streamtest.MemberReads(t, groups...)
	stream := bytes.Join(reads, nil)
	memberEnds := map[int]bool{}
	for i, n := 0, 0; i < len(reads); i++ {
		n += len(reads[i])
		memberEnds[n] = true
	}
	chunk := len(reads[1])*3/2 + 1 // most reads end inside a member
	for _, cut := range []bool{false, true} {
		t.Run(fmt.Sprintf("cut %v", cut), func(t *testing.T) {
			data := stream
			if cut {
				data = stream[:len(stream)-len(reads[len(reads)-1])/2]
			}
			g, sink := newTestGzipInspector(t, streamtest.JSONWatchType, 1<<20)
			heldAfter, endedInside := 0, 0
			for off := 0; off < len(data); {
				n := min(chunk, len(data)-off)
				g.Write(data[off : off+n])
				off += n
				switch {
				case !g.deferring:
				case memberEnds[off]:
					heldAfter++
				default:
					endedInside++
					if len(g.held) > 0 {
						t.Fatalf("a read ending %d bytes in left a member of %d bytes held", off, len(g.held))
					}
				}
			}
			if endedInside < 100 || heldAfter == 0 && !cut {
				t.Fatalf("%d reads ended inside a member, %d at a member end; the check proves little", endedInside, heldAfter)
			}
			g.Finish()
			wantErrors := []int32{410}
			if cut {
				wantErrors = nil
			}
			if g.off || !slices.Equal(sink.errors, wantErrors) || sink.events != 1 {
				t.Errorf("off %v, errors %v, events %d; want %v and the first event", g.off, sink.errors, sink.events, wantErrors)
			}
			if g.held != nil || g.pending != nil || g.budget.InUse() != 0 {
				t.Errorf("held %d, pending %v, budget used %d after the end", len(g.held), g.pending != nil, g.budget.InUse())
			}
		})
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
		"the shared budget spent":                           {0, [][][]byte{streamtest.JSONFrames()[:1], streamtest.JSONFrames()[1:2], streamtest.JSONFrames()[1:2], streamtest.JSONFrames()[2:]}},
		"a member over the stream's cap":                    {1 << 20, [][][]byte{streamtest.JSONFrames()[:1], {bigEvent}, streamtest.JSONFrames()[2:]}},
		"a member too large to keep inflated while checked": {1 << 20, [][][]byte{streamtest.JSONFrames()[:1], {hugeEvent}, streamtest.JSONFrames()[2:]}},
	} {
		t.Run(name, func(t *testing.T) {
			reads := streamtest.MemberReads(t, tc.groups...)
			g, sink := newTestGzipInspector(t, streamtest.JSONWatchType, tc.budget)
			for i, r := range reads {
				before := g.inflated
				g.Write(r)
				if i > 0 && i < len(reads)-1 && g.inflated == before {
					t.Errorf("member %d not inflated at once", i)
				}
				if (tc.budget == 0 || i == 1) && len(g.held) > 0 || g.budget.InUse() > tc.budget {
					t.Errorf("member %d: %d bytes held, budget used %d", i, len(g.held), g.budget.InUse())
				}
			}
			g.Finish()
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
	pb := streamtest.ProtobufFrames(t)
	fake := streamtest.GzipMembers(t, pb[2:]) // a whole member holding an ERROR 410
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
		return streamtest.LengthPrefixed(payload)
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
			reads := streamtest.MemberReads(t, tc.groups...)
			planted := slices.IndexFunc(reads, func(r []byte) bool { return bytes.Contains(r, fake) })
			if planted < 1 {
				t.Fatal("no member holds the look-alike member raw")
			}
			if tc.cutRead {
				i := bytes.Index(reads[planted], fake) + len(fake)
				reads = slices.Insert(reads, planted, reads[planted][:i])
				reads[planted+1] = reads[planted+1][i:]
			}
			g, sink := newTestGzipInspector(t, streamtest.ProtobufWatchType, 1<<20)
			unverified := metricstest.CounterValue(t, gzipInspectionsStopped.WithLabelValues(stopUnverified))
			for _, r := range reads {
				g.Write(r)
			}
			g.Finish()
			if got := metricstest.CounterValue(t, gzipInspectionsStopped.WithLabelValues(stopUnverified)) - unverified; got != 0 != tc.lastHeld {
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

// closedOnly encodes each group as one gzip member closed without a flush
// first, as an encoder other than kube-apiserver's may: its end is not
// gzipMemberEnd.
func closedOnly(t testing.TB, groups ...[][]byte) []byte {
	t.Helper()
	var out bytes.Buffer
	for _, g := range groups {
		w, err := gzip.NewWriterLevel(&out, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range g {
			if _, err := w.Write(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

// An ERROR event can only end a stream, so it is in the stream's last
// member, at its end; the inspector must see it there wherever that
// member lies and however large it and the members before it are: the
// stream's first frame; the end of a first member larger than the
// inspector inflates whole (a replay's backlog), which is the stream's
// only member; the end of a large last member after large ones; a small
// last member of its own; a last member past the stream's holding cap or
// the shared budget (inflated at once); members of another encoder, small
// or past the bytes one stream may keep. In every read size, JSON and
// protobuf. For kube-apiserver's members it inflates no more than the
// start of the first member (to a frame start past maxWholeFirstBytes) and
// the last member (twice when large).
func TestGzipInspectorSeesTheErrorThatEndsTheStreamInEveryPosition(t *testing.T) {
	events := streamtest.ManyEvents(3000) // about 900 KiB of JSON, then an ERROR 410
	jsonEvents, jsonErr := events[:3000], events[3000:]
	var pbEvents [][]byte // 3,000 ConfigMaps of about 1 KiB
	for b := streamtest.BenchProtobufEvents(t, 3000); len(b) > 0; {
		n := 4 + int(binary.BigEndian.Uint32(b))
		pbEvents, b = append(pbEvents, b[:n]), b[n:]
	}
	pbErr := streamtest.ProtobufFrames(t)[2:] // an ERROR 410
	var incompressible [][]byte
	for range 80 { // 7.5 MiB of JSON, over 4 MiB compressed
		incompressible = append(incompressible, append(append([]byte(`{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","data":{"k":`), randomText(96<<10)...), "}}}\n"...))
	}
	huge := append(append([]byte(`{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","data":{"k":`), randomText(2*maxHeldGzipBytes)...), "}}}\n"...)
	join := func(parts ...[][]byte) [][]byte { return slices.Concat(parts...) }

	type shape struct {
		contentType string
		groups      [][][]byte
		budget      int64
		otherEnds   bool // members closed without kube-apiserver's flush
		// kube: the inflated bytes are bounded as for kube-apiserver's
		// members (the first member's start and the last member).
		kube bool
	}
	shapes := map[string]shape{
		"json: the first frame": {streamtest.JSONWatchType, [][][]byte{jsonErr}, 1 << 20, false, true},
		"json: the end of the only member, larger than inflated whole": {streamtest.JSONWatchType,
			[][][]byte{join(jsonEvents, jsonErr)}, 1 << 20, false, true},
		"json: the end of a large last member after large ones": {streamtest.JSONWatchType,
			[][][]byte{jsonEvents[:1000], jsonEvents[1000:1500], join(jsonEvents[1500:], jsonErr)}, 1 << 20, false, true},
		"json: a small last member of its own": {streamtest.JSONWatchType,
			[][][]byte{jsonEvents[:1500], jsonEvents[1500:], jsonErr}, 1 << 20, false, true},
		"json: the end of a member past the shared budget": {streamtest.JSONWatchType,
			[][][]byte{jsonEvents[:1500], jsonEvents[1500:2000], join(jsonEvents[2000:], jsonErr)}, 0, false, false},
		"json: the end of a member past the stream's holding cap": {streamtest.JSONWatchType,
			[][][]byte{jsonEvents[:1500], {huge, jsonErr[0]}}, 64 << 20, false, false},
		"json: another encoder's members": {streamtest.JSONWatchType,
			[][][]byte{jsonEvents[:1000], jsonEvents[1000:2000], join(jsonEvents[2000:], jsonErr)}, 1 << 20, true, false},
		"json: another encoder's members, past what a stream keeps": {streamtest.JSONWatchType,
			[][][]byte{incompressible[:40], incompressible[40:], jsonErr}, 1 << 20, true, false},
		"protobuf: the first frame": {streamtest.ProtobufWatchType, [][][]byte{pbErr}, 1 << 20, false, true},
		"protobuf: the end of the only member, larger than inflated whole": {streamtest.ProtobufWatchType,
			[][][]byte{join(pbEvents, pbErr)}, 1 << 20, false, true},
		"protobuf: the end of a large last member after large ones": {streamtest.ProtobufWatchType,
			[][][]byte{pbEvents[:1000], pbEvents[1000:1500], join(pbEvents[1500:], pbErr)}, 1 << 20, false, true},
		"protobuf: a small last member of its own": {streamtest.ProtobufWatchType,
			[][][]byte{pbEvents[:1500], pbEvents[1500:], pbErr}, 1 << 20, false, true},
	}
	for name, tc := range shapes {
		t.Run(name, func(t *testing.T) {
			data := streamtest.GzipMembers(t, tc.groups...)
			if tc.otherEnds {
				data = closedOnly(t, tc.groups...)
			}
			last := tc.groups[len(tc.groups)-1]
			// The last member is inflated twice when it inflates to more
			// than maxCollectedBytes: checked, then shown.
			maxInflated := 4*maxWholeFirstBytes + 2*bytesOf(last...)
			for _, chunks := range [][]int{nil, {7, 13}, {4096}, {16 << 10}, {32 << 10}} {
				if len(data) > 1<<20 && len(chunks) > 0 && chunks[0] < 4096 {
					continue // reads of a few bytes over MiBs take long and prove nothing more
				}
				f, s, _, _ := FramingFor(tc.contentType, "gzip")
				sink := &recordingSink{}
				g := NewGzip(NewStream(f, s, sink), "alice")
				g.UseBudget(NewSharedBytes(tc.budget, tc.budget))
				for rest, i := data, 0; len(rest) > 0; i++ {
					n := len(rest)
					if len(chunks) > 0 {
						n = min(n, chunks[i%len(chunks)])
					}
					g.Write(rest[:n])
					rest = rest[n:]
				}
				g.Finish()
				if !slices.Equal(sink.errors, []int32{410}) || g.off {
					t.Errorf("chunks %v: errors %v, off %v; want [410]", chunks, sink.errors, g.off)
				}
				if len(tc.groups) > 1 && sink.events < 1 {
					t.Errorf("chunks %v: the first event not seen", chunks)
				}
				if tc.kube && g.inflated > maxInflated {
					t.Errorf("chunks %v: inflated %d bytes of a stream of %d; want at most %d (the first member's start and the last member)",
						chunks, g.inflated, bytesOf(slices.Concat(tc.groups...)...), maxInflated)
				}
				if g.held != nil || g.pending != nil || g.budget.InUse() != 0 {
					t.Errorf("chunks %v: held %d, pending %v, budget used %d after the end", chunks, len(g.held), g.pending != nil, g.budget.InUse())
				}
			}
		})
	}
}
