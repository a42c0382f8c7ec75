package proxy

import (
	"errors"
	"io"
	"net/http"
)

// idleReadBytes is the buffer an admitted watch's stream is read into
// while nothing flows: the one buffer an idle watch keeps. An event that
// fits (bookmarks, most ConfigMaps, small objects) goes to the client in
// one write, as through a bare reverse proxy; a larger one in two, the
// rest read into a pooled copy buffer.
const idleReadBytes = 4 << 10

// bufferPool hands out copy buffers of copyBufferBytes.
type bufferPool interface {
	Get() []byte
	Put([]byte)
}

// copyWatch relays an admitted watch's stream from body to w, flushing
// after every read, until body ends (nil at io.EOF) or a read or write
// fails (that error).
//
// httputil.ReverseProxy reads a response through one copy buffer for its
// whole life: for a watch, 32 KiB held while the stream is idle, which is
// most of the time, and most of what an idle watch costs. copyWatch blocks
// in a read of idleReadBytes instead, and takes a pooled copy buffer only
// when that read came back full, so more is likely waiting, for one read,
// and returns it to the pool right after. A burst keeps the pooled buffer
// read after read as long as each read fills it. A read that does not fill
// its buffer ends the burst: the next one waits in the small buffer again.
//
// Every read's bytes are written and flushed before the next read, which
// may wait for the next event, so nothing is held back.
func copyWatch(w http.ResponseWriter, body io.Reader, pool bufferPool) error {
	rc := http.NewResponseController(w)
	small := make([]byte, idleReadBytes)
	full := false
	for {
		buf, pooled := small, false
		if full {
			buf, pooled = pool.Get(), true
		}
		n, rerr := body.Read(buf)
		full = n == len(buf)
		var werr error
		if n > 0 {
			if _, werr = w.Write(buf[:n]); werr == nil {
				werr = rc.Flush()
			}
		}
		if pooled {
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
