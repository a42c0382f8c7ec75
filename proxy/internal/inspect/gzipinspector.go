package inspect

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Bounds of the inspection of a gzip-encoded watch stream. Inflating costs
// CPU the stream's bytes do not show, so it is bounded three ways; past any
// bound, inspection of that stream ends and its bytes pass on untouched.
const (
	// MaxInflatedBytesPerStream caps the bytes the proxy inflates for one
	// stream over its life (64 MiB, about a tenth of a CPU second at gzip's
	// speed). The ERROR events that teach the proxy come at a stream's
	// start (a too old or too new version) or end it.
	MaxInflatedBytesPerStream = 64 << 20
	// maxInflatedBytesPerRead caps the bytes inflated on one read of the
	// stream: a whole frame of the largest inspected size, and room to
	// decode again the start of a member cut by the read.
	maxInflatedBytesPerRead = 2 * MaxInspectedFrameBytes
	// maxInflationRatio caps inflated bytes per compressed byte of a gzip
	// member, beyond a first maxInflationSlack: watch events of Kubernetes
	// objects inflate 5 to 30 times at kube-apiserver's gzip level 1; a
	// gzip bomb inflates up to 1032 times.
	maxInflationRatio = 128
	maxInflationSlack = 64 << 10
	// maxPendingGzipBytes caps the compressed bytes held of a member that
	// is cut by reads (the inflated frame cap, compressed).
	maxPendingGzipBytes = MaxInspectedFrameBytes
	// maxHeldGzipBytes caps the compressed bytes of the last member one
	// stream holds uninflated, in case it turns out to be the stream's
	// last: a watch-list's bookmark or event is a few hundred bytes to a
	// few KiB, the backlog kube-apiserver flushes at once in a replay up
	// to hundreds of KiB (2 to 95 KiB for 3,000 small ConfigMaps). A larger
	// member is inflated at once; so is a member past the budget.
	maxHeldGzipBytesShift = 20
	maxHeldGzipBytes      = 1 << maxHeldGzipBytesShift
	// maxWholeFirstBytes is how much of a member the inspector inflates
	// before its first frame is seen, and after it before it stops at the
	// next frame start (16 KiB, a dozen watch events): the first member of a stream is inflated
	// whole when it is no larger, which shows that the stream's members
	// end at frame ends, and only to a frame start past its first frame
	// otherwise (the rest of it is inflated only if the stream ends with
	// it).
	maxWholeFirstBytes = 16 << 10
	// maxHeldGzipBytesTotal caps those bytes across all streams: 32 MiB,
	// about 25,000 watch-lists idle after their replay; past it members
	// are inflated at once.
	maxHeldGzipBytesTotal = 32 << 20
	// maxHeldGzipBytesPerCaller is one caller's share of those: an
	// eighth, so that one caller's watch-lists cannot spend what the
	// others' would hold and leave their members to be inflated at once.
	maxHeldGzipBytesPerCaller = maxHeldGzipBytesTotal / 8
)

// Gzip shows a Stream the inflated bytes of a
// gzip-encoded watch stream, as kube-apiserver sends a watch-list to a
// client that accepts gzip: one complete gzip member per flush (a header,
// deflate data closed by a final block, a trailer), so members are
// independent and no inflating state needs to outlive one. It inflates a
// copy; the stream itself is never changed or held back.
//
// What the sink needs from a stream is its first frame (the version was
// valid, or a first ERROR 410 says it is stale) and whether an ERROR event
// went by. kube-apiserver's ERROR events are terminal: it sends one and
// closes the stream. So the inspector inflates every member until the
// inspector has seen a frame and the stream is at a member end
// kube-apiserver's way (gzipMemberEnd) and at a frame start, or, inside a
// member that inflates to more than maxWholeFirstBytes (a replay's first
// backlog), at the first frame start after a frame (a cut); from then on
// it defers: of a read that ends at a member end it keeps only that last
// member (compressed, in a pooled buffer of about its size) and drops it
// uninflated when more of the stream comes, for a member followed by more
// data cannot hold the ERROR that ends a watch; members followed by more
// data in their own read are dropped at once. When the stream ends
// (finish) the member held is inflated and shown. kube-apiserver flushes,
// and so ends members, only between events: the member held starts a
// frame, as the inspector, which has seen nothing since it started
// deferring at a frame start, expects; when deferring began inside a
// member, that member, if it is the one held at the end, is shown from
// where the inspector stopped. A member is held within bounds: at most
// maxHeldGzipBytes per stream and heldGzipBudget across all streams, an
// eighth of it per caller; past
// either, it is inflated at once. A watch idle after its replay holds its
// last member, a bookmark or an event (a few hundred bytes to a few KiB)
// or the backlog flushed with the bookmark (tens of KiB).
//
// While deferring, a member's start is only where the member before it
// seemed to end, and a tenant's object bytes can pass raw through deflate
// (stored blocks of incompressible data) and so mimic a member end and a
// member. A member that is skipped is never shown, so a look-alike can only
// matter in the member shown at the end, and that member is shown only
// once inflateMember has checked that it inflates as exactly one gzip
// member (header, CRC-32, size) ending exactly where a member end was
// recognised. In JSON a look-alike cannot be planted at all: JSON escapes
// control bytes, so 0x1f, 0x00 and 0x01 never appear raw in the stream's
// text. In protobuf a look-alike that starts inside an object must end
// exactly at a real member's end and carry that member's CRC-32 and size,
// which are computed over bytes around the tenant's that the tenant does
// not control; a look-alike ending where a read happens to end is
// dropped when the rest of the real member comes, and a stream that the
// client or the proxy cut is not inspected at its end (watchBody).
//
// Before deferring, members that lie within one read are inflated in place
// without a copy. A member cut by the end of a read is kept (compressed,
// in a pooled buffer) from its start, and inflated once it has come whole
// (its end recognised as gzipMemberEnd), so each member is inflated once.
// Members that end otherwise (another encoder) are never deferred: they
// are inflated as far as they have come, and again from their start when
// the bytes kept have doubled since the last try (so at most about twice
// over) or the stream ends. A cut comes before the member's end is seen:
// when no end kube-apiserver's way follows it within maxPendingGzipBytes,
// deferring ends (undefer) and the member is inflated from where the
// inspector stopped, as are those after it; when the stream ends first, so
// is what came of it. The bytes of a member already shown to the
// inspector are not shown again. compress/gzip cannot resume once it ran
// out of input, which is why it inflates again rather than carrying on;
// in return no inflater is held between reads (they are pooled), and no
// goroutine runs beside the stream.
//
// Not safe for concurrent use: the reading goroutine owns it.
type Gzip struct {
	next *Stream
	off  bool
	// deferring: only the last member of the stream is inflated.
	deferring bool
	// otherEnds: a member inflated whole did not end kube-apiserver's
	// way; deferring then begins only at a member end.
	otherEnds bool

	// pending holds the compressed bytes from the start of a member that
	// continues in the next read; nil when reads end at member ends.
	pending *[]byte
	// shown is how many inflated bytes of pending's first member the
	// inspector has seen already, from the first tried bytes of pending
	// (the last try). Unused while deferring.
	shown int
	tried int
	// partial is how many inflated bytes of the member at pending's start
	// the inspector has seen when deferring began inside that member; 0
	// once a member end follows.
	partial int
	// held is the last complete member while deferring, in heldBuf (a
	// pooled buffer, heldbuffers.go) whose capacity is taken from budget
	// while it is not nil. The inspector has seen the first heldSkip of
	// its inflated bytes.
	held     []byte
	heldBuf  *[]byte
	heldSkip int
	budget   *SharedBytes
	// caller is whose share of budget held is taken from.
	caller string
	// inflated counts the bytes inflated for this stream, including those
	// inflated again.
	inflated int64
}

// NewGzip returns a Gzip that shows the inflated watch stream to next;
// the member it holds is charged to caller's share of the budget all gzip
// streams share.
func NewGzip(next *Stream, caller string) *Gzip {
	return &Gzip{next: next, budget: heldGzipBudget, caller: caller}
}

// heldGzipBudget is the compressed bytes all gzip streams may hold
// uninspected (maxHeldGzipBytesTotal), a share of it per caller
// (maxHeldGzipBytesPerCaller).
var heldGzipBudget = NewSharedBytes(maxHeldGzipBytesTotal, maxHeldGzipBytesPerCaller)

// gzipReaders and inflatedBuffers are shared by all streams: a stream
// holds them only while it inflates.
var (
	gzipReaders     = sync.Pool{New: func() any { return new(gzip.Reader) }}
	inflatedBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
)

// gzipMemberEnd is how every member of kube-apiserver's watch streams ends
// (Go's gzip.Writer Flush then Close): an empty final stored block
// (01 00 00 ff ff), then the CRC-32 and the size, 4 bytes each.
var gzipMemberEnd = []byte{0x01, 0x00, 0x00, 0xff, 0xff}

// gzipMagic starts every gzip member.
var gzipMagic = []byte{0x1f, 0x8b}

// lastMemberEnd returns where the last member of b that ends as
// kube-apiserver's members end (gzipMemberEnd, 8 bytes, then the end of b
// or the next member's magic) ends, looking only at ends after from; 0 when
// none. Compressed data may hold the same bytes by chance: the inflater
// then finds the member incomplete, and nothing is lost but the try. Only
// the bytes that can hold such an end are searched, so a member that
// arrives in many reads costs one pass over its bytes, not one per read;
// the pass is bytes.Index's (vectorised), forwards.
func lastMemberEnd(b []byte, from int) int {
	last := 0
	for i := max(0, from-len(gzipMemberEnd)-8+1); i < len(b); i++ {
		j := bytes.Index(b[i:], gzipMemberEnd)
		if j < 0 {
			break
		}
		i += j
		end := i + len(gzipMemberEnd) + 8
		if end > len(b) {
			break // so do the ends of any later ones
		}
		if end > from && (end == len(b) ||
			end+1 == len(b) && b[end] == gzipMagic[0] ||
			b[end] == gzipMagic[0] && b[end+1] == gzipMagic[1]) {
			last = end
		}
	}
	return last
}

// write inspects the next compressed chunk of the stream; p is not
// retained.
func (g *Gzip) Write(p []byte) {
	if g.off {
		return
	}
	if g.deferring {
		g.writeDeferred(p)
		return
	}
	gzipInflatedBytes.Add(float64(len(p)))
	if g.pending == nil {
		limit := lastMemberEnd(p, 0)
		recognised := limit > 0
		if limit == 0 {
			limit = len(p) // not a member end kube-apiserver's way: inflate what there is
		}
		// A read too large to keep is inflated as it comes.
		n, shown, ok, cut := g.inflate(p[:limit], 0, len(p) <= maxPendingGzipBytes)
		switch {
		case !ok:
			return
		case cut:
			g.keep(p[n:], 0, 0)
			g.deferInside(shown)
			return
		}
		if n < len(p) {
			g.keep(p[n:], shown, limit-n)
		}
		g.deferFrom(recognised && n == limit)
		return
	}
	if len(*g.pending)+len(p) > maxPendingGzipBytes {
		g.stop(stopBound)
		return
	}
	from := len(*g.pending)
	*g.pending = append(*g.pending, p...)
	b := *g.pending
	if limit := lastMemberEnd(b, from); limit > 0 {
		g.retry(limit)
		g.deferFrom(g.tried == 0)
	} else if len(b) >= 2*g.tried {
		g.retry(len(b))
	}
}

// deferFrom starts deferring when the members inflated so far ended at a
// member end kube-apiserver's way (atEnd), the bytes kept (if any) start
// the next member, and the inspector has seen a frame and waits for the
// next.
func (g *Gzip) deferFrom(atEnd bool) {
	if atEnd && !g.off && g.shown == 0 && g.tried == 0 && g.next.sawFrame && g.next.atFrameStart() {
		g.deferring = true
	}
}

// deferInside starts deferring inside the member that pending starts,
// of which the inspector has seen shown inflated bytes and stands at a
// frame start.
func (g *Gzip) deferInside(shown int) {
	if g.off {
		return
	}
	g.deferring, g.partial = true, shown
	g.shown, g.tried = 0, 0
	g.scan(*g.pending, 0)
}

// undefer stops deferring when the member deferring began in has not ended
// kube-apiserver's way within maxPendingGzipBytes (another encoder): the
// bytes kept are inflated from where the inspector stopped, as before
// deferring, and so is p.
func (g *Gzip) undefer(p []byte) {
	g.deferring, g.otherEnds = false, true
	g.shown, g.tried, g.partial = g.partial, 0, 0
	g.retry(len(*g.pending))
	if !g.off {
		g.Write(p)
	}
}

// writeDeferred drops the member held (more of the stream came), and holds
// the last member that ends in this read, if any; bytes after it are kept
// as pending, from that member's end.
func (g *Gzip) writeDeferred(p []byte) {
	if len(g.held) > 0 {
		gzipSkippedBytes.Add(float64(len(g.held)))
		g.held = g.held[:0]
	}
	b, from := p, 0
	if g.pending != nil {
		if len(*g.pending)+len(p) > maxPendingGzipBytes {
			if g.partial > 0 {
				g.undefer(p)
				return
			}
			g.stop(stopBound)
			return
		}
		// Ends up to the kept bytes' end were judged by earlier reads.
		from = len(*g.pending)
		*g.pending = append(*g.pending, p...)
		b = *g.pending
	}
	g.scan(b, from)
}

// scan holds the last member of b (pending, or a read when nothing is
// pending) that ends after from, if any, when it ends b, and keeps the
// bytes after it as pending, from that member's end. A member followed by
// bytes of the next is skipped at once: like one the next read follows, it
// cannot hold the ERROR that ends a watch.
func (g *Gzip) scan(b []byte, from int) {
	end := lastMemberEnd(b, from)
	if end == 0 {
		if g.pending == nil {
			g.keep(b, 0, 0)
		}
		return
	}
	partial := g.partial
	g.partial = 0
	if rest := b[end:]; len(rest) > 0 {
		gzipSkippedBytes.Add(float64(end))
		if g.pending != nil {
			*g.pending = b[:copy(b, rest)]
		} else {
			g.keep(rest, 0, 0)
		}
		return
	}
	// The last member starts where the one before it ends, or where b
	// starts: at a member end too, or where deferring began.
	// Ends up to from were judged before: none is in b.
	start := lastMemberEnd(b[:end-1], from)
	g.heldSkip = 0
	if start == 0 {
		g.heldSkip = partial
	}
	gzipSkippedBytes.Add(float64(start))
	g.hold(b[start:end])
	if !g.off {
		g.releasePending()
	}
}

// hold keeps a copy of member m in held, in a pooled buffer of its size
// rounded up to a power of two (one of at most four times that is kept
// from the member before) and taken from the budget, or inflates it at
// once when it is larger than maxHeldGzipBytes or the budget is spent.
func (g *Gzip) hold(m []byte) {
	if c := cap(g.held); c < len(m) || c > 4*max(len(m), minHeldBuffer) {
		g.releaseHeld()
		if len(m) > maxHeldGzipBytes {
			g.inflateMember(m, g.heldSkip)
			return
		}
		class := heldBufferClass(len(m))
		if !g.budget.take(g.caller, heldBufferSize(class)) {
			g.inflateMember(m, g.heldSkip)
			return
		}
		g.heldBuf = getHeldBuffer(class)
		g.held = *g.heldBuf
	}
	g.held = append(g.held[:0], m...)
}

// Finish is told that the stream ended: the member held, or a member still
// kept before deferring, or the rest of the member deferring began in when
// no member end followed it, is inflated and shown. Bytes kept after the
// member held (a member the stream cut) are not: their start is not
// certain and they cannot be checked whole.
func (g *Gzip) Finish() {
	if !g.off {
		switch {
		case g.deferring && len(g.held) > 0:
			m := g.held
			g.held = g.held[:0]
			g.inflateMember(m, g.heldSkip)
		case g.deferring && g.partial > 0 && g.pending != nil:
			// A member that never ended kube-apiserver's way: its start is
			// certain, as far as it came.
			skip := g.partial
			g.partial = 0
			g.inflate(*g.pending, skip, false)
		case !g.deferring && g.pending != nil && len(*g.pending) > g.tried:
			g.retry(len(*g.pending))
		}
	}
	g.Release()
}

// inflateMember shows the inspector the inflated bytes of m past its first
// skip (shown before) only once it
// has found that m is exactly one valid gzip member: it inflates m and
// checks its header, CRC-32 and size and that it ends exactly at m's end,
// then shows what it inflated: kept meanwhile when it is at most
// maxCollectedBytes (a watch event), inflated again otherwise. A member
// that is not is not shown, and inspection of the stream ends.
func (g *Gzip) inflateMember(m []byte, skip int) {
	gzipInflatedBytes.Add(float64(len(m)))
	zr := gzipReaders.Get().(*gzip.Reader)
	out := inflatedBuffers.Get().(*[]byte)
	kept := frameBuffers.Get().(*[]byte)
	collected, collecting := (*kept)[:0], true
	defer func() {
		*kept = collected[:0]
		if cap(collected) <= 1<<20 {
			frameBuffers.Put(kept)
		}
		inflatedBuffers.Put(out)
		gzipReaders.Put(zr)
	}()
	var src bytes.Reader
	src.Reset(m)
	err := zr.Reset(&src)
	member := 0
	if err == nil {
		zr.Multistream(false)
		for err == nil {
			var k int
			k, err = zr.Read(*out)
			member += k
			g.inflated += int64(k)
			if member > maxInflationRatio*len(m)+maxInflationSlack || member > maxInflatedBytesPerRead ||
				g.inflated > MaxInflatedBytesPerStream {
				err = errInflationBound
			}
			if collecting = collecting && member-skip <= maxCollectedBytes; collecting && member > skip {
				collected = append(collected, (*out)[max(0, k-(member-skip)):k]...)
			}
		}
	}
	switch {
	case errors.Is(err, errInflationBound):
		g.stop(stopBound)
		return
	case !errors.Is(err, io.EOF) || src.Len() != 0:
		g.stop(stopUnverified)
		return
	}
	if collecting {
		g.next.Write(collected)
		if g.next.off {
			g.stop("") // the inspector stopped
		}
		return
	}
	if n, _, ok, _ := g.inflate(m, skip, false); ok && n != len(m) {
		g.stop(stopUnverified)
	}
}

// maxCollectedBytes caps the inflated bytes of a member kept to be shown
// once checked; a larger member is inflated again to be shown.
const maxCollectedBytes = 1 << 20

var errInflationBound = errors.New("inflation bound reached")

// retry inflates the kept bytes up to limit again from their start, and
// keeps the rest.
func (g *Gzip) retry(limit int) {
	b := *g.pending
	n, shown, ok, cut := g.inflate(b[:limit], g.shown, true)
	switch {
	case !ok:
		return
	case cut:
		*g.pending = b[:copy(b, b[n:])]
		g.deferInside(shown)
		return
	}
	if n == len(b) {
		g.releasePending()
		return
	}
	if n > 0 {
		// Members ended: keep only the rest, from its start.
		m := copy(b, b[n:])
		*g.pending = b[:m]
	}
	g.shown, g.tried = shown, limit-n
}

// keep starts keeping rest, the start of a member cut by the read, of
// which the first tried bytes were inflated and gave shown inflated bytes
// to the inspector.
func (g *Gzip) keep(rest []byte, shown, tried int) {
	if len(rest) > maxPendingGzipBytes {
		g.stop(stopBound)
		return
	}
	g.pending = frameBuffers.Get().(*[]byte)
	*g.pending = append((*g.pending)[:0], rest...)
	g.shown, g.tried = shown, tried
}

// inflate inflates the members in b and shows the inspector their bytes,
// except the first skip bytes of the first member (shown before). It
// returns how many bytes of b the complete members took and how many
// inflated bytes of the incomplete member after them the inspector has
// seen; ok is false when inspection stopped (corrupt data or a bound).
// With mayCut, before deferring, in a member past maxWholeFirstBytes, it
// stops at the first frame start after a frame (cut): n is then where that
// member starts and shown how much of it the inspector saw.
func (g *Gzip) inflate(b []byte, skip int, mayCut bool) (n, shown int, ok, cut bool) {
	zr := gzipReaders.Get().(*gzip.Reader)
	defer gzipReaders.Put(zr)
	out := inflatedBuffers.Get().(*[]byte)
	defer inflatedBuffers.Put(out)
	var src bytes.Reader
	thisRead := 0
	for n < len(b) {
		src.Reset(b[n:])
		member := 0
		err := zr.Reset(&src)
		if err == nil {
			zr.Multistream(false)
			for err == nil {
				// Before a cut, inflate in small steps: each step's bytes
				// are inflated whole.
				buf := *out
				if mayCut && !g.deferring && !g.otherEnds {
					buf = buf[:4<<10]
				}
				var k int
				k, err = zr.Read(buf)
				member += k
				thisRead += k
				g.inflated += int64(k)
				if member > maxInflationRatio*(len(b)-n)+maxInflationSlack ||
					thisRead > maxInflatedBytesPerRead || g.inflated > MaxInflatedBytesPerStream {
					g.stop(stopBound)
					return 0, 0, false, false
				}
				if show := buf[:k]; member > skip {
					if len(show) > member-skip {
						show = show[len(show)-(member-skip):]
					}
					used, atCut := g.show(show, mayCut && !g.deferring && !g.otherEnds && member > maxWholeFirstBytes)
					if g.next.off {
						g.stop("") // the inspector stopped
						return 0, 0, false, false
					}
					if atCut {
						return n, member - (len(show) - used), true, true
					}
				}
			}
		}
		switch {
		case errors.Is(err, io.EOF):
			n += len(b) - n - src.Len()
			skip = 0
			if n < len(gzipMemberEnd)+8 || !bytes.Equal(b[n-8-len(gzipMemberEnd):n-8], gzipMemberEnd) {
				g.otherEnds = true
			}
		case errors.Is(err, io.ErrUnexpectedEOF):
			return n, max(member, skip), true, false // the member goes on in the next read
		default:
			g.stop(stopCorrupt) // not gzip, or corrupt: inspect no further
			return 0, 0, false, false
		}
	}
	return n, 0, true, false
}

// show shows p to the inspector. With mayCut, once the inspector has seen
// a frame, it shows p a frame at a time and stops at the first frame
// start (cut), returning how many bytes of p it showed.
func (g *Gzip) show(p []byte, mayCut bool) (used int, cut bool) {
	s := g.next
	for used < len(p) && !s.off {
		k := len(p) - used
		if mayCut && s.sawFrame {
			if s.atFrameStart() {
				return used, true
			}
			k = toFrameEnd(s, p[used:])
		}
		s.Write(p[used : used+k])
		used += k
	}
	return used, mayCut && !s.off && s.sawFrame && s.atFrameStart()
}

// toFrameEnd is how many bytes of p to show s so that the frame it is in
// may end: a protobuf frame's header or payload left; in JSON, through
// the next newline (kube-apiserver ends each event with one; elsewhere a
// newline is whitespace, and s says whether the frame ended).
func toFrameEnd(s *Stream, p []byte) int {
	if s.Framing == JSONFraming {
		if i := bytes.IndexByte(p, '\n'); i >= 0 {
			return i + 1
		}
		return len(p)
	}
	if s.nHeader < len(s.header) {
		return min(len(p), len(s.header)-s.nHeader)
	}
	return max(1, min(len(p), s.due))
}

// Why inspection of a gzip stream stopped (watchgate_proxy_gzip_inspections_stopped_total).
const (
	stopBound      = "bound"      // an inflation or holding bound
	stopCorrupt    = "corrupt"    // not gzip, or a corrupt member
	stopUnverified = "unverified" // a member held was not exactly one valid member
)

// stop ends inspection of this stream; reason, when not empty, is counted.
func (g *Gzip) stop(reason string) {
	if reason != "" {
		gzipInspectionsStopped.WithLabelValues(reason).Inc()
	}
	g.off = true
	g.Release()
	g.next.stop()
}

// Release returns the bytes kept and held. Bytes not inflated by then
// count as skipped.
func (g *Gzip) Release() {
	skipped := len(g.held)
	if g.deferring && g.pending != nil {
		skipped += len(*g.pending)
	}
	if skipped > 0 {
		gzipSkippedBytes.Add(float64(skipped))
	}
	g.releasePending()
	g.releaseHeld()
}

// releasePending returns the kept bytes' buffer to the pool.
func (g *Gzip) releasePending() {
	if g.pending != nil {
		*g.pending = (*g.pending)[:0]
		if cap(*g.pending) <= 1<<20 {
			frameBuffers.Put(g.pending)
		}
		g.pending = nil
	}
	g.shown, g.tried, g.partial = 0, 0, 0
}

// releaseHeld returns the held buffer to its pool and its bytes to the
// budget.
func (g *Gzip) releaseHeld() {
	if g.heldBuf != nil {
		g.budget.give(g.caller, cap(*g.heldBuf))
		putHeldBuffer(g.heldBuf)
		g.heldBuf, g.held = nil, nil
	}
}

var (
	gzipWatchBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_gzip_watch_bytes_total",
		Help: "Compressed bytes of gzip-encoded watch streams by how the proxy read them, how (inflated: a copy inflated to find ERROR events; " +
			"skipped: members followed by more of the stream, which cannot hold the ERROR event that ends a watch).",
	}, []string{"how"})
	gzipInflatedBytes = gzipWatchBytes.WithLabelValues("inflated")
	gzipSkippedBytes  = gzipWatchBytes.WithLabelValues("skipped")

	gzipInspectionsStopped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_gzip_inspections_stopped_total",
		Help: "gzip-encoded watch streams whose inspection stopped, their bytes passing on unread, by reason (bound: an inflation or " +
			"holding bound; corrupt: not gzip or a corrupt member; unverified: the member held for the stream's end was not exactly one valid gzip member).",
	}, []string{"reason"})

	gzipHeldBytes = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "watchgate_proxy_gzip_held_bytes",
		Help: "Bytes of the buffers holding compressed data across gzip-encoded watch streams: each stream's last member, inflated only if the stream ends there, in a buffer of its size rounded up to a power of two.",
	}, func() float64 { return float64(heldGzipBudget.InUse()) })
)

func init() {
	metrics.Registry.MustRegister(gzipWatchBytes, gzipInspectionsStopped, gzipHeldBytes)
}

// HeldMember is the member g holds for the stream's end, nil when none.
func (g *Gzip) HeldMember() []byte { return g.held }

// ChargedTo is whose share of the held-bytes budget g's held member
// takes.
func (g *Gzip) ChargedTo() string { return g.caller }

// UseBudget makes g hold members on budget instead of the budget all
// streams share; for tests, before g's first write.
func (g *Gzip) UseBudget(budget *SharedBytes) { g.budget = budget }
