package relay

import (
	"errors"
	"io"
	"net/http"
)

// bufferPool hands out copy buffers of copyBufferBytes.
type bufferPool interface {
	Get() []byte
	Put([]byte)
}

// relayedStream is what copyWatch relays: a stream that can also wait for
// its next bytes without a buffer.
type relayedStream interface {
	io.Reader
	// waitByte blocks until the stream has a byte and takes it; err is
	// the stream's end or failure, which may come with the byte (ok).
	waitByte() (b byte, ok bool, err error)
	// readAfter reads into p[1:] what the stream has after the byte
	// waitByte took, which p[0] holds, as one read of p: n counts that
	// byte.
	readAfter(p []byte) (n int, err error)
}

// writeProgress is told when a write to the client starts and returns
// (guard.Stream), so that a write that stalls can be cut.
type writeProgress interface {
	Writing(n int)
	Wrote(n int)
}

// copyWatch relays an admitted watch's stream from body to w, flushing
// after every read, until body ends (nil at io.EOF) or a read or write
// fails (that error). progress, when not nil, is told of each write and
// flush.
//
// httputil.ReverseProxy reads a response through one copy buffer for its
// whole life: for a watch, 32 KiB held while the stream is idle, which is
// most of the time, and most of what an idle watch costs. copyWatch holds
// no buffer while the stream is idle: it waits for the stream's next byte
// (waitByte), then takes a pooled copy buffer and reads, after that byte,
// what has come with it (readAfter): the rest of the HTTP/2 DATA frame at
// least, since a frame arrives whole. A read that fills the buffer means
// more is likely waiting, and the next read is into a pooled buffer
// straight away; a read that does not ends the burst, and the buffer goes
// back to the pool.
//
// Every read's bytes are written and flushed before the next read, which
// may wait for the next event, so nothing is held back. The one case where
// the read after waitByte waits is an upstream that sends a single byte in
// a frame of its own: its stream then reaches the client a frame later.
// kube-apiserver writes whole events.
func copyWatch(w http.ResponseWriter, body relayedStream, pool bufferPool, progress writeProgress) error {
	rc := http.NewResponseController(w)
	full := false
	for {
		var buf []byte
		var n int
		var rerr error
		if full {
			buf = pool.Get()
			n, rerr = body.Read(buf)
		} else {
			first, ok, err := body.waitByte()
			switch {
			case ok && err == nil:
				buf = pool.Get()
				buf[0] = first
				n, rerr = body.readAfter(buf)
			case ok:
				buf = pool.Get()
				buf[0] = first
				n, rerr = 1, err
			default:
				rerr = err
			}
		}
		full = n == len(buf) && n > 0
		var werr error
		if n > 0 {
			if progress != nil {
				progress.Writing(n)
			}
			if _, werr = w.Write(buf[:n]); werr == nil {
				werr = rc.Flush()
			}
			if progress != nil {
				progress.Wrote(n)
			}
		}
		if buf != nil {
			pool.Put(buf)
		}
		switch {
		case werr != nil:
			return werr
		case errors.Is(rerr, io.EOF):
			return nil
		case rerr != nil:
			return rerr
		}
	}
}
