package proxy

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"sync"
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
)

// gzipInspector shows a streamInspector the inflated bytes of a
// gzip-encoded watch stream, as kube-apiserver sends a watch-list to a
// client that accepts gzip: one complete gzip member per flush (a header,
// deflate data closed by a final block, a trailer), so members are
// independent and no inflating state needs to outlive one.
//
// It inflates a copy of what passes; the stream itself is never changed or
// held back. Members that lie within one read are inflated in place
// without a copy. A member cut by the end of a read is kept (compressed,
// in a pooled buffer) from its start, and inflated once it has come whole
// — its end is recognised by how kube-apiserver's members end
// (gzipMemberEnd) — so each member is inflated once. Members that end
// otherwise (another encoder) are inflated as far as they have come, and
// again from their start when the bytes kept have doubled since the last
// try (so at most about twice over) or the stream ends. The bytes of a
// member already shown to the inspector are not shown again. compress/gzip cannot resume once it ran out of input, which
// is why it inflates again rather than carrying on; in return no inflater
// is held between reads (they are pooled), and no goroutine runs beside
// the stream.
//
// Not safe for concurrent use: the reading goroutine owns it.
type gzipInspector struct {
	next *streamInspector
	off  bool

	// pending holds the compressed bytes from the start of a member that
	// continues in the next read; nil when reads end at member ends.
	pending *[]byte
	// shown is how many inflated bytes of pending's first member the
	// inspector has seen already, from the first tried bytes of pending
	// (the last try).
	shown int
	tried int
	// inflated counts the bytes inflated for this stream, including those
	// inflated again.
	inflated int64
}

func newGzipInspector(next *streamInspector) *gzipInspector {
	return &gzipInspector{next: next}
}

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
// then finds the member incomplete, and nothing is lost but the try.
func lastMemberEnd(b []byte, from int) int {
	for hi := len(b); ; {
		i := bytes.LastIndex(b[:hi], gzipMemberEnd)
		if i < 0 {
			return 0
		}
		end := i + len(gzipMemberEnd) + 8
		if end <= from {
			return 0
		}
		switch {
		case end == len(b),
			end+1 == len(b) && b[end] == gzipMagic[0],
			end+1 < len(b) && b[end] == gzipMagic[0] && b[end+1] == gzipMagic[1]:
			return end
		}
		hi = i + len(gzipMemberEnd) - 1 // an earlier one, perhaps overlapping
	}
}

// write inspects the next compressed chunk of the stream; p is not
// retained.
func (g *gzipInspector) write(p []byte) {
	if g.off {
		return
	}
	if g.pending == nil {
		limit := lastMemberEnd(p, 0)
		if limit == 0 {
			limit = len(p) // not a member end kube-apiserver's way: inflate what there is
		}
		n, shown, ok := g.inflate(p[:limit], 0)
		if !ok || n == len(p) {
			return
		}
		g.keep(p[n:], shown, limit-n)
		return
	}
	if len(*g.pending)+len(p) > maxPendingGzipBytes {
		g.stop()
		return
	}
	from := len(*g.pending)
	*g.pending = append(*g.pending, p...)
	b := *g.pending
	if limit := lastMemberEnd(b, from); limit > 0 {
		g.retry(limit)
	} else if len(b) >= 2*g.tried {
		g.retry(len(b))
	}
}

// finish is told that the stream ended: a member still kept is inflated
// as far as it goes.
func (g *gzipInspector) finish() {
	if !g.off && g.pending != nil && len(*g.pending) > g.tried {
		g.retry(len(*g.pending))
	}
	g.release()
}

// retry inflates the kept bytes up to limit again from their start, and
// keeps the rest.
func (g *gzipInspector) retry(limit int) {
	b := *g.pending
	n, shown, ok := g.inflate(b[:limit], g.shown)
	if !ok {
		return
	}
	if n == len(b) {
		g.release()
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
func (g *gzipInspector) keep(rest []byte, shown, tried int) {
	if len(rest) > maxPendingGzipBytes {
		g.stop()
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
func (g *gzipInspector) inflate(b []byte, skip int) (n, shown int, ok bool) {
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
				var k int
				k, err = zr.Read(*out)
				member += k
				thisRead += k
				g.inflated += int64(k)
				if member > maxInflationRatio*(len(b)-n)+maxInflationSlack ||
					thisRead > maxInflatedBytesPerRead || g.inflated > MaxInflatedBytesPerStream {
					g.stop()
					return 0, 0, false
				}
				if show := (*out)[:k]; member > skip {
					if len(show) > member-skip {
						show = show[len(show)-(member-skip):]
					}
					g.next.write(show)
					if g.next.off {
						g.stop()
						return 0, 0, false
					}
				}
			}
		}
		switch {
		case errors.Is(err, io.EOF):
			n += len(b) - n - src.Len()
			skip = 0
		case errors.Is(err, io.ErrUnexpectedEOF):
			return n, max(member, skip), true // the member goes on in the next read
		default:
			g.stop() // not gzip, or corrupt: inspect no further
			return 0, 0, false
		}
	}
	return n, 0, true
}

// stop ends inspection of this stream.
func (g *gzipInspector) stop() {
	g.off = true
	g.release()
	g.next.stop()
}

// release returns the kept bytes' buffer to the pool.
func (g *gzipInspector) release() {
	if g.pending != nil {
		*g.pending = (*g.pending)[:0]
		if cap(*g.pending) <= 1<<20 {
			frameBuffers.Put(g.pending)
		}
		g.pending = nil
	}
	g.shown, g.tried = 0, 0
}
