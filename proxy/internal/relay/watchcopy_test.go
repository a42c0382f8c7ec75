package relay

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/watchgate/watchgate/proxy/internal/upstream"
)

// scriptedStream hands out its arrivals one after another: a read returns
// what is left of the current arrival, at most len(p), as an HTTP/2 body
// returns what has arrived. check runs at the start of every read.
type scriptedStream struct {
	arrivals [][]byte
	end      error
	check    func(p []byte)
}

func (s *scriptedStream) Read(p []byte) (int, error) {
	s.check(p)
	if len(s.arrivals) == 0 {
		return 0, s.end
	}
	n := copy(p, s.arrivals[0])
	if s.arrivals[0] = s.arrivals[0][n:]; len(s.arrivals[0]) == 0 {
		s.arrivals = s.arrivals[1:]
	}
	return n, nil
}

// flushRecorder records what was written and how much of it was flushed.
type flushRecorder struct {
	written  bytes.Buffer
	flushed  int
	writeErr error
}

func (f *flushRecorder) Header() http.Header { return http.Header{} }
func (f *flushRecorder) WriteHeader(int)     {}
func (f *flushRecorder) Write(p []byte) (int, error) {
	if f.writeErr != nil {
		return 0, f.writeErr
	}
	return f.written.Write(p)
}
func (f *flushRecorder) Flush() { f.flushed = f.written.Len() }

// countingPool is copyBuffers that counts the buffers out.
type countingPool struct{ out int }

func (p *countingPool) Get() []byte  { p.out++; return upstream.CopyBuffers{}.Get() }
func (p *countingPool) Put(b []byte) { p.out--; upstream.CopyBuffers{}.Put(b) }

func TestCopyWatchHoldsNoBufferWhileWaiting(t *testing.T) {
	var want []byte
	var arrivals [][]byte
	for i, n := range []int{100, 4096, 5000, 40000} {
		a := bytes.Repeat([]byte{byte('a' + i)}, n)
		arrivals, want = append(arrivals, a), append(want, a...)
	}
	w := &flushRecorder{}
	pool := &countingPool{}
	var sizes []int
	read := 0
	stream := &scriptedStream{arrivals: arrivals, end: io.EOF}
	stream.check = func(p []byte) {
		sizes = append(sizes, len(p))
		switch len(p) {
		case 1:
			// Waiting for the next bytes: everything read so far reached
			// the client, and no copy buffer is out.
			if w.flushed != read || pool.out != 0 {
				t.Errorf("read %d waits with %d bytes read, %d flushed, %d pooled buffers out", len(sizes), read, w.flushed, pool.out)
			}
		default:
			// Reading what came: into a pooled buffer, after the byte
			// the wait took (not yet written) or after a full read.
			if pool.out != 1 || read-w.flushed > 1 {
				t.Errorf("read %d into %d bytes: %d bytes read, %d flushed, %d pooled buffers out", len(sizes), len(p), read, w.flushed, pool.out)
			}
		}
	}
	counted := &countingReads{r: stream, n: &read}
	if err := copyWatch(w, &readerStream{Reader: counted}, pool, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(w.written.Bytes(), want) {
		t.Errorf("client got %d bytes, want the %d sent unchanged", w.written.Len(), len(want))
	}
	// Each arrival: a wait of one byte, then the rest after it; 40000 =
	// 1 + 32767 (full) + 7232 (pooled, not full); EOF in a wait.
	rest := upstream.CopyBufferBytes - 1
	wantSizes := []int{1, rest, 1, rest, 1, rest, 1, rest, upstream.CopyBufferBytes, 1}
	if !slices.Equal(sizes, wantSizes) {
		t.Errorf("read sizes %v, want %v", sizes, wantSizes)
	}
	if pool.out != 0 {
		t.Errorf("%d pooled buffers not returned", pool.out)
	}
}

func TestCopyWatchReturnsTheFirstFailure(t *testing.T) {
	broken := errors.New("stream reset")
	for name, tc := range map[string]struct {
		stream   *scriptedStream
		writeErr error
		want     error
		written  int
	}{
		"a read error after the bytes that came with it": {
			stream: &scriptedStream{arrivals: [][]byte{make([]byte, 10)}, end: broken}, want: broken, written: 10,
		},
		"a write error (the client left)": {
			stream:   &scriptedStream{arrivals: [][]byte{make([]byte, 4096), make([]byte, 10)}, end: io.EOF},
			writeErr: broken, want: broken,
		},
		"the end of the stream": {
			stream: &scriptedStream{arrivals: [][]byte{make([]byte, 10)}, end: io.EOF}, written: 10,
		},
	} {
		t.Run(name, func(t *testing.T) {
			tc.stream.check = func([]byte) {}
			w := &flushRecorder{writeErr: tc.writeErr}
			pool := &countingPool{}
			if err := copyWatch(w, &readerStream{Reader: tc.stream}, pool, nil); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			if w.written.Len() != tc.written || pool.out != 0 {
				t.Errorf("wrote %d bytes (want %d), %d pooled buffers out", w.written.Len(), tc.written, pool.out)
			}
		})
	}
}

// countingReads counts the bytes read through it into n.
type countingReads struct {
	r io.Reader
	n *int
}

func (c *countingReads) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	*c.n += n
	return n, err
}

// readerStream is a relayedStream over a plain reader.
type readerStream struct {
	io.Reader
	one [1]byte
}

func (s *readerStream) waitByte() (byte, bool, error) {
	for {
		n, err := s.Read(s.one[:])
		if n == 1 || err != nil {
			return s.one[0], n == 1, err
		}
	}
}

func (s *readerStream) readAfter(p []byte) (int, error) {
	n, err := s.Read(p[1:])
	return n + 1, err
}

// TestMustAbort: a broken relay aborts the client's stream only while the
// client is there to see it, and only under an http.Server.
func TestMustAbort(t *testing.T) {
	served := context.WithValue(context.Background(), http.ServerContextKey, &http.Server{})
	left, leave := context.WithCancel(served)
	leave()
	broken := errors.New("upstream stream broke")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"broken, client there", served, broken, true},
		{"broken, client left", left, broken, false},
		{"ended cleanly", served, nil, false},
		{"broken, no http.Server (a test's handler)", context.Background(), broken, false},
	} {
		r, _ := http.NewRequestWithContext(tc.ctx, http.MethodGet, "/", nil)
		if got := mustAbort(tc.err, r); got != tc.want {
			t.Errorf("%s: mustAbort = %v, want %v", tc.name, got, tc.want)
		}
	}
}
