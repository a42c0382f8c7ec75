package guard

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// DefaultStalledStreamTimeout is how long a write to a client may make
	// no progress before its stream is cut (--stalled-stream-timeout).
	DefaultStalledStreamTimeout = 30 * time.Second
	// DefaultMaxListsPerIdentity caps the lists one caller has in flight
	// through a replica (--max-lists-per-identity).
	DefaultMaxListsPerIdentity = 100
	// bufferedShareDivisor: a caller's streams may hold at most this
	// fraction of the memory high-water mark buffered (an eighth), so that
	// eight callers at their share still leave the replica under its mark.
	bufferedShareDivisor = 8
	// defaultBufferedBytesPerCaller is a caller's share without a memory
	// limit to take an eighth of.
	defaultBufferedBytesPerCaller = 64 << 20
	// minSweepInterval is the shortest interval between sweeps.
	minSweepInterval = 100 * time.Millisecond
)

// Streams accounts, per caller, the bytes its forwarded watches and lists
// hold buffered in the proxy: what the API server sent that the client
// has not taken yet (the upstream stream's receive buffer, the copy being
// written), the inspector's partial frame and the gzip bytes it keeps.
// Each stream reports its own bytes (Stream.AddBuffered) and when it
// writes to its client (Stream.Writing, Stream.Wrote).
//
// A sweep (Sweep, every quarter of the stall timeout) cuts a stream whose
// write to its client has made no progress for the stall timeout, as
// kube-apiserver's watch cache closes a watcher that does not keep up:
// the write fails, the relay ends, and the stream's buffers are freed.
// Above the memory mark it also cuts the stalled streams of the caller
// that holds the most bytes, whatever their age.
//
// Callers are told apart by their tenant (TenantOf: the authenticated
// identity, never an impersonated one, and a namespace's service accounts
// together, as the watch guard counts them), so that minting service
// accounts does not multiply a share; "caller" below is that tenant. State is one entry per caller
// holding streams and a Stream per stream, both freed when the stream
// closes. The hot path (AddBuffered, Writing, Wrote) is atomic adds; Open
// and Close take one lock. It is safe for concurrent use.
type Streams struct {
	// stallTimeout: a write to a client without progress for longer is
	// cut; 0 never cuts.
	stallTimeout time.Duration
	// maxLists caps one caller's lists in flight; 0 is no cap.
	maxLists int
	// bufferedTotal is every stream's bytes.
	bufferedTotal atomic.Int64

	mu      sync.Mutex
	callers map[string]*callerStreams // guarded by mu
	// all streams, a list through Stream.prev/next; guarded by mu.
	head *Stream
	n    int
}

// callerStreams is one caller's streams.
type callerStreams struct {
	name     string
	buffered atomic.Int64
	// streams and lists it has open; guarded by Streams.mu.
	streams, lists int
}

// NewStreams returns a Streams that cuts writes stalled for stallTimeout
// (0: never) and admits at most maxLists lists in flight per caller (0: no
// cap).
// It is the one watchgate_proxy_buffered_bytes reports.
func NewStreams(stallTimeout time.Duration, maxLists int) *Streams {
	s := &Streams{stallTimeout: stallTimeout, maxLists: maxLists, callers: map[string]*callerStreams{}}
	currentStreams.Store(s)
	return s
}

// currentStreams is the Streams built last.
var currentStreams atomic.Pointer[Streams]

// Stream is one forwarded watch or list, as Streams accounts it.
type Stream struct {
	owner  *Streams
	caller *callerStreams
	list   bool
	// buffered is the stream's own bytes.
	buffered atomic.Int64
	// writes counts the starts and ends of writes to the client: odd while
	// one is in progress.
	writes atomic.Uint64

	// The sweep's view, guarded by owner.mu: writes as the last sweep saw
	// them, and since when they have not moved while odd.
	seen         uint64
	stalledSince time.Time
	prev, next   *Stream

	// cutMu orders cut against Close: cut runs only while the stream is
	// open (its handler has not returned).
	cutMu  sync.Mutex
	closed bool
	cut    func()
	wasCut atomic.Bool
}

// Open accounts a stream of caller (a list when list is set); cut makes
// its write to the client fail (for a handler's w: WriteCutter(w)). Close
// it when the stream ends, before its handler returns.
func (s *Streams) Open(caller string, list bool, cut func()) *Stream {
	st := &Stream{owner: s, list: list, cut: cut}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := TenantOf(caller)
	c := s.callers[key]
	if c == nil {
		c = &callerStreams{name: key}
		s.callers[key] = c
	}
	c.streams++
	if list {
		c.lists++
	}
	st.caller = c
	st.next = s.head
	if s.head != nil {
		s.head.prev = st
	}
	s.head = st
	s.n++
	streamsOpen.Inc()
	return st
}

// Close ends the stream's accounting: its bytes are given back and it can
// no longer be cut. Only the first call does anything.
func (st *Stream) Close() {
	st.cutMu.Lock()
	if st.closed {
		st.cutMu.Unlock()
		return
	}
	st.closed = true
	st.cutMu.Unlock()
	st.AddBuffered(-int(st.buffered.Load()))
	s := st.owner
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.prev != nil {
		st.prev.next = st.next
	} else {
		s.head = st.next
	}
	if st.next != nil {
		st.next.prev = st.prev
	}
	st.prev, st.next = nil, nil
	s.n--
	c := st.caller
	c.streams--
	if st.list {
		c.lists--
	}
	if c.streams == 0 {
		delete(s.callers, c.name)
	}
	streamsOpen.Dec()
}

// AddBuffered counts delta more bytes (fewer when negative) held for the
// stream.
func (st *Stream) AddBuffered(delta int) {
	if delta == 0 {
		return
	}
	d := int64(delta)
	st.buffered.Add(d)
	st.caller.buffered.Add(d)
	st.owner.bufferedTotal.Add(d)
}

// Writing is told that a write of n bytes to the client starts; they count
// as buffered until Wrote.
func (st *Stream) Writing(n int) {
	st.writes.Add(1)
	st.AddBuffered(n)
}

// Wrote is told that the write Writing announced returned.
func (st *Stream) Wrote(n int) {
	st.AddBuffered(-n)
	st.writes.Add(1)
}

// WasCut reports whether the stream was cut for a stalled write.
func (st *Stream) WasCut() bool { return st.wasCut.Load() }

// doCut makes the stream's write fail, unless it closed.
func (st *Stream) doCut() bool {
	st.cutMu.Lock()
	defer st.cutMu.Unlock()
	if st.closed || st.cut == nil {
		return false
	}
	st.wasCut.Store(true)
	st.cut()
	return true
}

// WriteCutter returns a cut for a stream written to w: it sets w's write
// deadline in the past, which fails the write in progress and every
// later one (HTTP/2: the stream is reset; HTTP/1: the connection's
// writes fail). w must be the handler's writer or wrap it (Unwrap).
func WriteCutter(w http.ResponseWriter) func() {
	rc := http.NewResponseController(w)
	return func() { _ = rc.SetWriteDeadline(time.Unix(1, 0)) }
}

// callerHeld is what caller c holds for the memory guard: its bytes
// buffered and watchMemoryBytes for each stream it has open. s.mu is held.
func callerHeld(c *callerStreams) int64 {
	return c.buffered.Load() + int64(c.streams)*watchMemoryBytes
}

// aboveAverage reports whether caller holds at least the average of what
// the callers holding streams hold, counting caller among them: above the
// memory mark those callers are refused, the others admitted. With nothing
// held at all, everyone is.
func (s *Streams) aboveAverage(caller string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	callers := int64(len(s.callers))
	var held int64
	if c := s.callers[TenantOf(caller)]; c != nil {
		held = callerHeld(c)
	} else {
		callers++
	}
	total := s.bufferedTotal.Load() + int64(s.n)*watchMemoryBytes
	return held*callers >= total
}

// bufferedVerdict is the reason to refuse caller a new stream for its own
// streams' sake: its buffered bytes at share, or, for a list, its lists
// at the cap; "" to admit.
func (s *Streams) bufferedVerdict(caller string, list bool, share int64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.callers[TenantOf(caller)]
	switch {
	case c == nil:
		return ""
	case c.buffered.Load() >= share:
		return GuardBufferedBytes
	case list && s.maxLists > 0 && c.lists >= s.maxLists:
		return GuardMaxListsPerIdentity
	}
	return ""
}

// Sweep cuts the streams whose write to their client has not moved since
// a sweep stallTimeout or more before now; with overMark, also those of
// the caller holding the most bytes buffered whose write has not moved
// since the last sweep. It returns how many it cut.
func (s *Streams) Sweep(now time.Time, overMark bool) int {
	var cut []*Stream
	s.mu.Lock()
	var top *callerStreams
	if overMark {
		for _, c := range s.callers {
			if b := c.buffered.Load(); b > 0 && (top == nil || b > top.buffered.Load()) {
				top = c
			}
		}
	}
	for st := s.head; st != nil; st = st.next {
		w := st.writes.Load()
		if w%2 == 0 || w != st.seen {
			st.seen, st.stalledSince = w, time.Time{}
			if w%2 == 1 {
				st.stalledSince = now
			}
			continue
		}
		if (s.stallTimeout > 0 && now.Sub(st.stalledSince) >= s.stallTimeout) || st.caller == top {
			cut = append(cut, st)
		}
	}
	s.mu.Unlock()
	n := 0
	for _, st := range cut {
		if st.doCut() {
			n++
			kind := "watch"
			if st.list {
				kind = "list"
			}
			stalledStreamsCut.WithLabelValues(kind).Inc()
		}
	}
	return n
}

// SweepInterval is how often Sweep should run: a quarter of the stall
// timeout, at least minSweepInterval, at most memorySampleInterval×4.
func (s *Streams) SweepInterval() time.Duration {
	return max(minSweepInterval, min(s.stallTimeout/4, 4*memorySampleInterval))
}

// BufferedBytes is every stream's bytes.
func (s *Streams) BufferedBytes() int64 { return s.bufferedTotal.Load() }

// CallerBuffered is the bytes caller's streams hold.
func (s *Streams) CallerBuffered(caller string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.callers[TenantOf(caller)]; c != nil {
		return c.buffered.Load()
	}
	return 0
}

// Writer wraps w, the writer of the stream's handler, so that its writes
// and flushes are told to the stream (Writing, Wrote); everything else is
// w's, reached through Unwrap (http.ResponseController).
func (st *Stream) Writer(w http.ResponseWriter) http.ResponseWriter {
	return progressWriter{ResponseWriter: w, st: st, rc: http.NewResponseController(w)}
}

type progressWriter struct {
	http.ResponseWriter
	st *Stream
	rc *http.ResponseController
}

func (w progressWriter) Write(p []byte) (int, error) {
	w.st.Writing(len(p))
	defer w.st.Wrote(len(p))
	return w.ResponseWriter.Write(p)
}

// FlushError flushes w; http.ResponseController calls it.
func (w progressWriter) FlushError() error {
	w.st.Writing(0)
	defer w.st.Wrote(0)
	return w.rc.Flush()
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w progressWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
