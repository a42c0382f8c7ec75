package upstream

import (
	"errors"
	"io"
	"net/http"
	"sync"

	"golang.org/x/net/http2"
)

// watchChunkBytes is the size of the pooled chunks a watch stream's
// received DATA waits in until the relay reads it: the largest DATA frame
// the proxy accepts (it announces no larger SETTINGS_MAX_FRAME_SIZE than
// HTTP/2's default), so a frame spans at most two chunks.
const watchChunkBytes = 16 << 10

// watchChunk is a piece of a stream's receive buffer: b[r:w] is unread.
type watchChunk struct {
	b    [watchChunkBytes]byte
	r, w int
}

var watchChunkPool = sync.Pool{New: func() any { return new(watchChunk) }}

var (
	errWatchBodyClosed = errors.New("watchgate: read on a closed upstream watch body")
	// errWatchStreamUnsent is the failure of a stream the API server did
	// not process (REFUSED_STREAM, GOAWAY below it): it may be sent again.
	errWatchStreamUnsent = errors.New("watchgate: upstream did not process the watch")
)

// watchConnStream is one admitted watch's HTTP/2 stream on a watchConn,
// and its response body. It is what an open watch costs on the upstream
// side: this struct, a channel and the context's AfterFunc registration;
// no goroutine, no timer, and no buffer while the watch is idle. The
// handler goroutine that relays the watch blocks in Read on ready, a
// shallow stack (copyWatch → watchBody.waitByte → Read → chanrecv).
//
// The connection's read loop appends the DATA it receives to chunks
// (pooled) and signals ready; Read takes bytes out, returns chunks to the
// pool as they empty and gives the stream's flow-control credit back to
// the API server as it reads, so a slow client holds at most the stream's
// window here, upstreamInitialStreamWindowBytes unless its client kept up
// before (the connection's credit goes back as DATA arrives: one slow
// client never stalls the connection's other watches). The bytes waiting
// are reported to the request's BufferAccount, if any.
//
// After RoundTrip has returned, nothing here keeps the request or the
// response alive.
type watchConnStream struct {
	cc *watchConn
	id uint32
	// ready has a token when something changed for the waiting goroutine
	// (RoundTrip for the response, then Read for the body).
	ready chan struct{}
	stop  func() bool // ends the request context's AfterFunc; set before the stream is in cc.streams
	// open: the stream counts on its connection (not ended, reset or
	// failed); guarded by cc.mu.
	open bool

	mu sync.Mutex
	// The response head, until RoundTrip takes it.
	status        int
	header        http.Header
	contentLength int64
	gotResponse   bool // the final (non-1xx) HEADERS came
	chunks        []*watchChunk
	buffered      int
	inflow        int           // receive window the API server may still use
	window        int           // the stream's window: inflow, buffered and unacked bytes
	account       BufferAccount // told the bytes buffered; nil: none
	unacked       int           // read (or padding) credit not yet returned
	eof           bool          // END_STREAM came: io.EOF after the buffered bytes
	err           error         // the stream failed; Read returns it (buffers freed)
	retry         bool          // err came before the API server processed the request
	closed        bool          // Close was called
}

// signal wakes the goroutine waiting on the stream, if any.
func (s *watchConnStream) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// receive stores a DATA frame's payload: n is the frame's flow-controlled
// length (payload and padding). It returns a stream error code when the
// frame breaks the protocol, 0 otherwise.
func (s *watchConnStream) receive(data []byte, n int, end bool) http2.ErrCode {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.gotResponse:
		return http2.ErrCodeProtocol
	case n > s.inflow:
		return http2.ErrCodeFlowControl
	}
	s.inflow -= n
	s.unacked += n - len(data) // padding is never read: credit it with the next read
	if s.err == nil && !s.closed {
		for len(data) > 0 {
			var c *watchChunk
			if k := len(s.chunks); k > 0 && s.chunks[k-1].w < watchChunkBytes {
				c = s.chunks[k-1]
			} else {
				c = watchChunkPool.Get().(*watchChunk)
				c.r, c.w = 0, 0
				s.chunks = append(s.chunks, c)
			}
			m := copy(c.b[c.w:], data)
			c.w += m
			s.buffered += m
			data = data[m:]
			if s.account != nil {
				s.account.AddBuffered(m)
			}
		}
	}
	if end {
		s.eof = true
	}
	s.signal()
	return 0
}

// Read returns the bytes received so far, waiting for some when there are
// none; after END_STREAM and the last byte, io.EOF; after a failure, the
// failure (the request context's error when it ended the watch).
func (s *watchConnStream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		s.mu.Lock()
		switch {
		case s.closed:
			s.mu.Unlock()
			return 0, errWatchBodyClosed
		case s.err != nil:
			err := s.err
			s.mu.Unlock()
			return 0, err
		case s.buffered > 0:
			n := s.take(p)
			credit := 0
			s.unacked += n
			if !s.eof && s.unacked >= s.window/2 {
				credit, s.unacked = s.unacked, 0
				if s.buffered == 0 && s.window < upstreamMaxStreamWindowBytes {
					// The client took all that came: the window, not the
					// client, holds the stream back.
					credit += s.window
					s.window *= 2
				}
				s.inflow += credit
			}
			s.mu.Unlock()
			if credit > 0 {
				s.cc.writeWindowUpdate(s.id, credit)
			}
			return n, nil
		case s.eof:
			s.mu.Unlock()
			return 0, io.EOF
		}
		s.mu.Unlock()
		<-s.ready
	}
}

// take copies buffered bytes into p, returning emptied chunks to the
// pool. s.mu is held.
func (s *watchConnStream) take(p []byte) int {
	n := 0
	for n < len(p) && len(s.chunks) > 0 {
		c := s.chunks[0]
		m := copy(p[n:], c.b[c.r:c.w])
		c.r += m
		n += m
		if c.r == c.w {
			watchChunkPool.Put(c)
			s.chunks[0] = nil
			s.chunks = s.chunks[1:]
		}
	}
	s.buffered -= n
	if s.account != nil {
		s.account.AddBuffered(-n)
	}
	if len(s.chunks) == 0 {
		s.chunks = nil // an idle stream holds no buffer
	}
	return n
}

// freeLocked returns the stream's chunks to the pool. s.mu is held.
func (s *watchConnStream) freeLocked() {
	for _, c := range s.chunks {
		watchChunkPool.Put(c)
	}
	if s.account != nil {
		s.account.AddBuffered(-s.buffered)
	}
	s.chunks, s.buffered = nil, 0
}

// fail ends the stream with err, which Read and RoundTrip return from now
// on (retry: err came before the API server processed the request);
// buffered bytes are dropped. A stream that already ended or failed
// keeps its end.
func (s *watchConnStream) fail(err error, retry bool) {
	s.mu.Lock()
	if s.err == nil && !s.eof {
		s.err = err
		s.retry = retry && !s.gotResponse
		s.freeLocked()
	}
	s.mu.Unlock()
	s.signal()
}

// end fails the stream (see fail) from the connection's side, and
// forgets the request context's AfterFunc: the stream is in its
// connection's map, so stop is set.
func (s *watchConnStream) end(err error, retry bool) {
	s.fail(err, retry)
	s.stop()
}

// cancel is the request context's AfterFunc: the watch ends with the
// context's error, and the API server is told (RST_STREAM CANCEL).
func (s *watchConnStream) cancel(err error) {
	s.fail(err, false)
	s.cc.resetStream(s, http2.ErrCodeCancel)
}

// Close frees the stream's buffers and, when the API server has not ended
// it, resets it (RST_STREAM CANCEL).
func (s *watchConnStream) Close() error {
	s.stop()
	s.mu.Lock()
	s.closed = true
	s.freeLocked()
	s.mu.Unlock()
	s.signal()
	s.cc.resetStream(s, http2.ErrCodeCancel)
	return nil
}
