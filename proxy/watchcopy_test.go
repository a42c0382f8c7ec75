package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"slices"
	"testing"
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

func (p *countingPool) Get() []byte  { p.out++; return copyBuffers{}.Get() }
func (p *countingPool) Put(b []byte) { p.out--; copyBuffers{}.Put(b) }

func TestCopyWatchTakesAPooledBufferOnlyAfterAFullRead(t *testing.T) {
	var want []byte
	var arrivals [][]byte
	for i, n := range []int{100, idleReadBytes, 5000, 40000} {
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
		// Everything read so far reached the client before this read,
		// which may wait for the next event.
		if w.flushed != read {
			t.Errorf("read %d: %d bytes read before it, %d flushed", len(sizes), read, w.flushed)
		}
		if pooled := len(p) == copyBufferBytes; pool.out != btoi(pooled) {
			t.Errorf("read %d into %d bytes: %d pooled buffers out", len(sizes), len(p), pool.out)
		}
	}
	counted := &countingReads{r: stream, n: &read}
	if err := copyWatch(w, counted, pool); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(w.written.Bytes(), want) {
		t.Errorf("client got %d bytes, want the %d sent unchanged", w.written.Len(), len(want))
	}
	// 100 (small, not full); 4096 (small, full); 5000 (pooled, not full);
	// 40000 = 4096 (small, full) + 32768 (pooled, full) + 3136 (pooled);
	// EOF in the small buffer.
	wantSizes := []int{idleReadBytes, idleReadBytes, copyBufferBytes, idleReadBytes, copyBufferBytes, copyBufferBytes, idleReadBytes}
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
			stream:   &scriptedStream{arrivals: [][]byte{make([]byte, idleReadBytes), make([]byte, 10)}, end: io.EOF},
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
			if err := copyWatch(w, tc.stream, pool); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
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

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
