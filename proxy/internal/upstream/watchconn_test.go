package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"
)

// scriptedH2 is a small real HTTP/2 server over TLS whose every
// connection the test scripts frame by frame (serve), for what Go's
// server does not do on demand: GOAWAY below a request, REFUSED_STREAM,
// late SETTINGS, and frames that break the protocol.
type scriptedH2 struct {
	url      string
	cfg      *rest.Config
	accepted atomic.Int64
}

// scriptedConn is one accepted connection, its client preface read.
type scriptedConn struct {
	t    *testing.T
	conn net.Conn
	fr   *http2.Framer
	n    int64 // which connection: 1 for the first accepted
	mu   sync.Mutex
	henc *hpack.Encoder
	hbuf bytes.Buffer
}

func newScriptedH2(t *testing.T, serve func(c *scriptedConn)) *scriptedH2 {
	t.Helper()
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptedH2{url: "https://" + ln.Addr().String()}
	s.cfg = &rest.Config{Host: s.url, TLSClientConfig: rest.TLSClientConfig{CAData: certPEM}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			n := s.accepted.Add(1)
			mu.Lock()
			open = append(open, conn)
			mu.Unlock()
			wg.Go(func() {
				defer conn.Close()
				preface := make([]byte, len(http2.ClientPreface))
				if _, err := io.ReadFull(conn, preface); err != nil || string(preface) != http2.ClientPreface {
					return
				}
				c := &scriptedConn{t: t, conn: conn, fr: http2.NewFramer(conn, conn), n: n}
				c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
				c.henc = hpack.NewEncoder(&c.hbuf)
				serve(c)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return s
}

// request reads frames until a request's HEADERS, acknowledging the
// client's SETTINGS; nil when the connection ended.
func (c *scriptedConn) request() *http2.MetaHeadersFrame {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return nil
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			return f
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.write(func() error { return c.fr.WriteSettingsAck() })
			}
		}
	}
}

// frames reads frames until one satisfies want, or the connection ends.
func (c *scriptedConn) frames(want func(http2.Frame) bool) bool {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return false
		}
		if want(f) {
			return true
		}
	}
}

func (c *scriptedConn) write(fn func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = fn()
}

func (c *scriptedConn) settings(s ...http2.Setting) {
	c.write(func() error { return c.fr.WriteSettings(s...) })
}

// headers sends a response head, fields as name, value pairs.
func (c *scriptedConn) headers(id uint32, end bool, fields ...string) {
	c.write(func() error {
		c.hbuf.Reset()
		for i := 0; i+1 < len(fields); i += 2 {
			_ = c.henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: end, EndHeaders: true})
	})
}

func (c *scriptedConn) data(id uint32, end bool, p string) {
	c.write(func() error { return c.fr.WriteData(id, end, []byte(p)) })
}

func (s *scriptedH2) client(t *testing.T) *watchClient {
	t.Helper()
	_, transport, err := NewTransport(s.cfg, &ConnectionCount{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wc := transport.(Transport).watches
	t.Cleanup(wc.CloseIdleConnections)
	return wc
}

func (s *scriptedH2) get(t *testing.T, wc *watchClient, path string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, s.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return wc.RoundTrip(req)
}

// A stream the server refuses, and one above a GOAWAY's last stream, are
// sent again, on the same connection or a new one; the streams below the
// GOAWAY go on.
func TestWatchClientRetriesWhatTheServerDidNotProcess(t *testing.T) {
	checkNoGoroutineLeak(t)
	var refused atomic.Bool
	s := newScriptedH2(t, func(c *scriptedConn) {
		c.settings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 10})
		for {
			req := c.request()
			if req == nil {
				return
			}
			id := req.StreamID
			switch path := req.PseudoValue("path"); {
			case path == "/refused" && refused.CompareAndSwap(false, true):
				c.write(func() error { return c.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream) })
			case path == "/goaway" && c.n == 1:
				c.write(func() error { return c.fr.WriteGoAway(id-2, http2.ErrCodeNo, nil) })
			default:
				c.headers(id, false, ":status", "200", "x-conn", string(rune('0'+c.n)))
				c.data(id, false, path)
			}
		}
	})
	wc := s.client(t)
	read := func(resp *http.Response) string {
		buf := make([]byte, 64)
		n, _ := resp.Body.Read(buf)
		return resp.Header.Get("X-Conn") + " " + string(buf[:n])
	}
	first, err := s.get(t, wc, "/first")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	resp, err := s.get(t, wc, "/refused")
	if err != nil {
		t.Fatal(err)
	}
	if got := read(resp); got != "1 /refused" || !refused.Load() {
		t.Errorf("the refused watch, sent again: %q", got)
	}
	_ = resp.Body.Close()
	resp, err = s.get(t, wc, "/goaway")
	if err != nil {
		t.Fatal(err)
	}
	if got := read(resp); got != "2 /goaway" {
		t.Errorf("the watch above the GOAWAY, sent again: %q, want it on the second connection", got)
	}
	_ = resp.Body.Close()
	if got := read(first); got != "1 /first" {
		t.Errorf("the watch below the GOAWAY read %q, want it going on", got)
	}
	if n := s.accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// A new connection serves one request until the server's SETTINGS come;
// the requests that come meanwhile wait for the dial, and then share the
// connection up to its limit.
func TestWatchClientWaitsForSettings(t *testing.T) {
	checkNoGoroutineLeak(t)
	s := newScriptedH2(t, func(c *scriptedConn) {
		time.Sleep(200 * time.Millisecond)
		c.settings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 3})
		for {
			req := c.request()
			if req == nil {
				return
			}
			c.headers(req.StreamID, false, ":status", "200")
		}
	})
	wc := s.client(t)
	var wg sync.WaitGroup
	bodies := make(chan io.Closer, 6)
	for range 6 {
		wg.Go(func() {
			resp, err := s.get(t, wc, "/")
			if err != nil {
				t.Error(err)
				return
			}
			bodies <- resp.Body
		})
	}
	wg.Wait()
	close(bodies)
	for b := range bodies {
		_ = b.Close()
	}
	if n := s.accepted.Load(); n != 2 {
		t.Errorf("%d connections for 6 watches at 3 per connection, want 2", n)
	}
}

// 1xx answers are skipped, trailers ignored, padding and DATA in many
// frames read in order.
func TestWatchClientInformationalAndTrailers(t *testing.T) {
	checkNoGoroutineLeak(t)
	s := newScriptedH2(t, func(c *scriptedConn) {
		c.settings()
		req := c.request()
		if req == nil {
			return
		}
		id := req.StreamID
		c.headers(id, false, ":status", "100")
		c.headers(id, false, ":status", "103", "link", "</x>")
		c.headers(id, false, ":status", "200", "content-type", "application/json", "content-length", "11")
		c.write(func() error { return c.fr.WriteDataPadded(id, false, []byte("hello "), make([]byte, 40)) })
		c.data(id, false, "world")
		c.headers(id, true, "x-trailer", "t")
		c.frames(func(http2.Frame) bool { return false })
	})
	wc := s.client(t)
	resp, err := s.get(t, wc, "/")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.ContentLength != 11 || string(body) != "hello world" || err != nil {
		t.Errorf("got %d length %d %q %v", resp.StatusCode, resp.ContentLength, body, err)
	}
	_ = resp.Body.Close()
}

// A connection that fails before its SETTINGS come fails the requests
// waiting for it, rather than send them dialing again and again.
func TestWatchClientConnectionFailingBeforeSettings(t *testing.T) {
	checkNoGoroutineLeak(t)
	s := newScriptedH2(t, func(c *scriptedConn) { _ = c.conn.Close() })
	wc := s.client(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := s.get(t, wc, "/"); err == nil || !strings.Contains(err.Error(), "HTTP/2") {
				t.Errorf("got %v, want the connection's failure", err)
			}
		})
	}
	wg.Wait()
	if n := s.accepted.Load(); n > 4 {
		t.Errorf("%d connections accepted for 4 requests, want at most one each", n)
	}
}

// An upstream that breaks the protocol gets a clear error, never a panic,
// a hang or a leak.
func TestWatchClientHostileUpstream(t *testing.T) {
	for name, tc := range map[string]struct {
		respond func(c *scriptedConn, id uint32)
		// inBody: the head came, and the body's read fails.
		inBody bool
	}{
		"malformed :status": {respond: func(c *scriptedConn, id uint32) { c.headers(id, false, ":status", "2x0") }},
		"no :status":        {respond: func(c *scriptedConn, id uint32) { c.headers(id, false, "content-type", "x") }},
		"101 Switching Protocols": {respond: func(c *scriptedConn, id uint32) {
			c.headers(id, false, ":status", "101")
		}},
		"DATA before HEADERS": {respond: func(c *scriptedConn, id uint32) { c.data(id, false, "x") }},
		"a header list over the limit": {respond: func(c *scriptedConn, id uint32) {
			big := strings.Repeat("v", 15<<10)
			fields := []string{":status", "200"}
			for range 80 {
				fields = append(fields, "x-big", big)
			}
			c.write(func() error {
				c.hbuf.Reset()
				for i := 0; i+1 < len(fields); i += 2 {
					_ = c.henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1], Sensitive: true})
				}
				block := c.hbuf.Bytes()
				first := true
				for len(block) > 0 {
					frag := block[:min(len(block), 16<<10)]
					block = block[len(frag):]
					if first {
						_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndHeaders: len(block) == 0})
						first = false
					} else {
						_ = c.fr.WriteContinuation(id, len(block) == 0, frag)
					}
				}
				return nil
			})
		}},
		"PUSH_PROMISE": {respond: func(c *scriptedConn, id uint32) {
			c.write(func() error {
				return c.fr.WritePushPromise(http2.PushPromiseParam{StreamID: id, PromiseID: 2, BlockFragment: []byte{0x82}, EndHeaders: true})
			})
		}},
		"DATA beyond the stream's window": {inBody: true, respond: func(c *scriptedConn, id uint32) {
			c.headers(id, false, ":status", "200")
			chunk := strings.Repeat("x", 16<<10)
			for range upstreamInitialStreamWindowBytes/len(chunk) + 1 {
				c.data(id, false, chunk)
			}
			// Once the PING is acknowledged the client has taken all of
			// it in, before the test reads and credit goes back.
			c.write(func() error { return c.fr.WritePing(false, [8]byte{1}) })
			c.frames(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
		}},
		"a frame larger than announced": {respond: func(c *scriptedConn, id uint32) {
			c.write(func() error {
				// A DATA frame header of 1 MiB, which the client never allowed.
				_, err := c.conn.Write([]byte{0x10, 0, 0, byte(http2.FrameData), 0, 0, 0, 0, byte(id)})
				return err
			})
		}},
		"garbage": {respond: func(c *scriptedConn, id uint32) {
			c.write(func() error { _, err := c.conn.Write(bytes.Repeat([]byte{0xff}, 64)); return err })
		}},
		"the connection closes": {respond: func(c *scriptedConn, id uint32) { _ = c.conn.Close() }},
		"the connection closes mid-body": {inBody: true, respond: func(c *scriptedConn, id uint32) {
			c.headers(id, false, ":status", "200")
			c.data(id, false, "partial")
			_ = c.conn.Close()
		}},
	} {
		t.Run(name, func(t *testing.T) {
			checkNoGoroutineLeak(t)
			responded := make(chan struct{})
			var once sync.Once
			s := newScriptedH2(t, func(c *scriptedConn) {
				c.settings()
				req := c.request()
				if req == nil {
					return
				}
				tc.respond(c, req.StreamID)
				once.Do(func() { close(responded) })
				c.frames(func(http2.Frame) bool { return false })
			})
			wc := s.client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/", nil)
			resp, err := wc.RoundTrip(req)
			if tc.inBody {
				if err != nil {
					t.Fatalf("the head: %v", err)
				}
				<-responded // read once all was sent: no credit goes back before
				_, err = io.ReadAll(resp.Body)
				_ = resp.Body.Close()
			}
			if err == nil || errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("got %v, want a clear error", err)
			}
			t.Logf("error: %v", err)
		})
	}
}
