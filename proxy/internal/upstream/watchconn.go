package upstream

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
)

const (
	// upstreamMaxHeaderListBytes bounds a watch response's header list
	// (SETTINGS_MAX_HEADER_LIST_SIZE): kube-apiserver's are a few hundred
	// bytes.
	upstreamMaxHeaderListBytes = 1 << 20
	// upstreamWriteTimeout bounds one write to the API server; a
	// connection that cannot take a frame for so long is broken.
	upstreamWriteTimeout = 30 * time.Second
	// watchConnCreditBytes batches the connection's flow-control credit,
	// returned as DATA arrives: its window (2 GiB - 1) never drops by more.
	watchConnCreditBytes = 256 << 10
	// watchConnDefaultStreams is the stream limit of a connection whose
	// SETTINGS carry none (HTTP/2 then means unlimited), Go's own default.
	watchConnDefaultStreams = 1000
	// watchConnMaxStreamID is the last stream a client may open.
	watchConnMaxStreamID = math.MaxInt32
)

// Flow control of the upstream HTTP/2 connections. The proxy reads a
// watch's stream only as fast as its client takes it, so a slow client's
// unread events wait in the transport's buffer for that stream, up to the
// stream's window, and hold as much of the connection's window. A
// connection whose window is taken by its slow streams stalls all its
// streams, the fast clients' too. With at most 1 MiB of window per stream
// and the largest window per connection HTTP/2 allows (2 GiB - 1; Go's
// transport announces it above the initial 64 KiB, hence the difference),
// that cannot happen below 2,047 streams per connection (kube-apiserver
// allows 100 by default, --http2-max-streams-per-connection; aggregated API
// servers 1,000). Go's defaults: 4 MiB per stream, 1 GiB per connection,
// which 256 slow watches on one connection exhaust.
//
// net/http's transport (requests other than admitted watches and lists)
// has a fixed window of upstreamStreamWindowBytes per stream. The watch
// client's streams (admitted watches and lists) start at
// upstreamInitialStreamWindowBytes, and a stream's window doubles, up to
// upstreamMaxStreamWindowBytes, each time its client has taken every byte
// that came by the time half of the window is read (watchConnStream.Read):
// an idle or slow stream holds at most 64 KiB, one whose client keeps up
// grows to 1 MiB within five round trips.
const (
	upstreamStreamWindowBytes        = 1 << 20
	upstreamInitialStreamWindowBytes = 64 << 10
	upstreamMaxStreamWindowBytes     = 1 << 20
	upstreamConnectionWindowBytes    = math.MaxInt32 - 65535
)

// watchConn is an HTTP/2 connection to the API server carrying admitted
// watches only (GET, no request body): watchgate's own minimal client,
// because net/http's costs an open watch a goroutine (4 KiB of stack) and
// ~10 KiB of heap on the client side for the watch's whole life (its
// clientStream with four channels, pipe, Response, the request's clone),
// which decides how many watches a replica holds. Here a watch costs a
// watchConnStream.
//
// One goroutine per connection reads frames (readLoop) and hands DATA to
// the streams; writes (HEADERS, RST_STREAM, WINDOW_UPDATE, SETTINGS and
// PING acks) go out under wmu, from whichever goroutine has one. The
// connection is safe for simultaneous use by multiple goroutines.
type watchConn struct {
	conn net.Conn
	tls  *tls.ConnectionState
	fr   *http2.Framer
	// settings is closed when the server's first SETTINGS came, or the
	// connection failed.
	settings chan struct{}

	wmu  sync.Mutex // writes: fr's write side, bw, henc, hbuf
	bw   *bufio.Writer
	henc *hpack.Encoder
	hbuf bytes.Buffer

	// Read loop only.
	inflow  int // connection receive window the server may still use
	unacked int // connection credit not yet returned

	mu            sync.Mutex
	streams       map[uint32]*watchConnStream
	used          int    // streams reserved or open
	nextID        uint32 // the next stream's ID
	maxStreams    int    // the server's SETTINGS_MAX_CONCURRENT_STREAMS
	sawSettings   bool
	peerFrameSize uint32 // the server's SETTINGS_MAX_FRAME_SIZE
	goingAway     bool   // GOAWAY came: no new streams
	err           error  // the connection failed
	lastUsed      time.Time
}

// newWatchConn starts HTTP/2 on conn, which negotiated h2: it sends the
// client preface, its SETTINGS (no push, upstreamInitialStreamWindowBytes per
// stream initially, header lists up to upstreamMaxHeaderListBytes) and opens the
// connection's window to upstreamConnectionWindowBytes, then reads.
func newWatchConn(conn net.Conn, state *tls.ConnectionState, now time.Time) (*watchConn, error) {
	cc := &watchConn{
		conn: conn, tls: state, settings: make(chan struct{}),
		streams: map[uint32]*watchConnStream{}, nextID: 1, maxStreams: 1,
		peerFrameSize: 16 << 10, inflow: 65535 + upstreamConnectionWindowBytes, lastUsed: now,
	}
	cc.bw = bufio.NewWriter(conn)
	cc.fr = http2.NewFramer(cc.bw, bufio.NewReader(conn))
	cc.fr.SetMaxReadFrameSize(watchChunkBytes) // HTTP/2's default; the proxy announces no other
	cc.fr.MaxHeaderListSize = upstreamMaxHeaderListBytes
	cc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	cc.henc = hpack.NewEncoder(&cc.hbuf)

	cc.wmu.Lock()
	_ = conn.SetWriteDeadline(time.Now().Add(upstreamWriteTimeout))
	_, err := cc.bw.WriteString(http2.ClientPreface)
	if err == nil {
		err = cc.fr.WriteSettings(
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: upstreamInitialStreamWindowBytes},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: upstreamMaxHeaderListBytes},
		)
	}
	if err == nil {
		err = cc.fr.WriteWindowUpdate(0, upstreamConnectionWindowBytes)
	}
	if err == nil {
		err = cc.bw.Flush()
	}
	cc.wmu.Unlock()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("upstream HTTP/2 preface: %w", err)
	}
	go cc.readLoop()
	return cc, nil
}

// reserve takes a stream for a request when the connection has one free:
// within the server's limit, or only the first before its SETTINGS came.
func (cc *watchConn) reserve(now time.Time) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	limit := cc.maxStreams
	if !cc.sawSettings {
		limit = 1
	}
	if cc.err != nil || cc.goingAway || cc.nextID+2*uint32(cc.used) > watchConnMaxStreamID || cc.used >= limit {
		return false
	}
	cc.used++
	cc.lastUsed = now
	return true
}

// unreserve gives back a reservation that opened no stream.
func (cc *watchConn) unreserve() {
	cc.mu.Lock()
	cc.used--
	idle := cc.goingAway && cc.used == 0
	cc.mu.Unlock()
	if idle {
		_ = cc.conn.Close()
	}
}

// state reports whether the connection failed or is going away, whether
// it carries no stream, and when a request last reserved one.
func (cc *watchConn) state() (unusable, idle bool, lastUsed time.Time) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err != nil || cc.goingAway, cc.used == 0, cc.lastUsed
}

// close closes the connection; its read loop fails its streams.
func (cc *watchConn) close() { _ = cc.conn.Close() }

// roundTrip sends req on a stream reserved with reserve and waits for the
// response's head. retry reports that the API server did not process the
// request (REFUSED_STREAM, GOAWAY, the connection broke before an
// answer), which may then be sent again.
func (cc *watchConn) roundTrip(req *http.Request) (resp *http.Response, retry bool, err error) {
	ctx := req.Context()
	s := &watchConnStream{cc: cc, ready: make(chan struct{}, 1), open: true,
		inflow: upstreamInitialStreamWindowBytes, window: upstreamInitialStreamWindowBytes, account: BufferAccountFrom(ctx)}

	cc.wmu.Lock()
	cc.hbuf.Reset()
	if err := encodeWatchRequestHeaders(cc.henc, req); err != nil {
		cc.hbuf.Reset()
		cc.wmu.Unlock()
		cc.unreserve()
		return nil, false, err
	}
	cc.mu.Lock()
	if cc.err != nil || cc.goingAway {
		// The hpack encoder's state moved with the block never sent:
		// the connection is of no more use.
		cc.goingAway = true
		cc.mu.Unlock()
		cc.wmu.Unlock()
		cc.unreserve()
		return nil, true, errWatchStreamUnsent
	}
	s.id = cc.nextID
	cc.nextID += 2
	frameSize := int(cc.peerFrameSize)
	// Registered before the stream is visible: if ctx has ended, its
	// cancel waits for wmu and resets the stream after its HEADERS.
	s.stop = context.AfterFunc(ctx, func() { s.cancel(ctx.Err()) })
	cc.streams[s.id] = s
	cc.mu.Unlock()
	err = cc.writeHeadersLocked(s.id, cc.hbuf.Bytes(), frameSize)
	cc.hbuf.Reset()
	cc.wmu.Unlock()
	if err != nil {
		cc.fail(fmt.Errorf("watchgate: writing to the API server: %w", err))
	}

	for {
		s.mu.Lock()
		if s.gotResponse {
			resp = &http.Response{
				Status:     strconv.Itoa(s.status) + " " + http.StatusText(s.status),
				StatusCode: s.status, Proto: "HTTP/2.0", ProtoMajor: 2,
				Header: s.header, ContentLength: s.contentLength, Body: s,
				Request: req, TLS: cc.tls,
			}
			s.header = nil
			ended := s.eof && s.buffered == 0
			s.mu.Unlock()
			if ended {
				resp.Body = http.NoBody
				_ = s.Close()
			}
			return resp, false, nil
		}
		if s.err != nil {
			err, retry := s.err, s.retry
			s.mu.Unlock()
			return nil, retry, err
		}
		s.mu.Unlock()
		<-s.ready
	}
}

// writeHeadersLocked writes a request's header block as HEADERS and
// CONTINUATION frames of at most frameSize. cc.wmu is held.
func (cc *watchConn) writeHeadersLocked(id uint32, block []byte, frameSize int) error {
	_ = cc.conn.SetWriteDeadline(time.Now().Add(upstreamWriteTimeout))
	first := true
	for first || len(block) > 0 {
		frag := block
		if len(frag) > frameSize {
			frag = frag[:frameSize]
		}
		block = block[len(frag):]
		var err error
		if first {
			err = cc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndStream: true, EndHeaders: len(block) == 0})
			first = false
		} else {
			err = cc.fr.WriteContinuation(id, len(block) == 0, frag)
		}
		if err != nil {
			return err
		}
	}
	return cc.bw.Flush()
}

// write sends frames written by fn under wmu; a write that fails fails the
// connection.
func (cc *watchConn) write(fn func() error) {
	cc.wmu.Lock()
	_ = cc.conn.SetWriteDeadline(time.Now().Add(upstreamWriteTimeout))
	err := fn()
	if err == nil {
		err = cc.bw.Flush()
	}
	cc.wmu.Unlock()
	if err != nil {
		cc.fail(fmt.Errorf("watchgate: writing to the API server: %w", err))
	}
}

func (cc *watchConn) writeWindowUpdate(id uint32, n int) {
	cc.write(func() error { return cc.fr.WriteWindowUpdate(id, uint32(n)) })
}

// resetStream ends s on the connection, telling the server (RST_STREAM
// code) when s was still open. The stream keeps its place among the
// server's streams until the RST_STREAM is written: a request that takes
// the place writes its HEADERS after it, so the server never sees more
// streams than it allows (a Go server answers a stream over its
// acknowledged limit PROTOCOL_ERROR).
func (cc *watchConn) resetStream(s *watchConnStream, code http2.ErrCode) {
	if cc.detachStream(s) {
		cc.write(func() error { return cc.fr.WriteRSTStream(s.id, code) })
		cc.releaseStream()
	}
}

// endStream takes s, which the server ended, off the connection; it
// reports whether s was open.
func (cc *watchConn) endStream(s *watchConnStream) bool {
	if !cc.detachStream(s) {
		return false
	}
	cc.releaseStream()
	return true
}

// detachStream takes s out of the connection's streams, keeping its place
// (see releaseStream); it reports whether s was open.
func (cc *watchConn) detachStream(s *watchConnStream) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if !s.open {
		return false
	}
	s.open = false
	delete(cc.streams, s.id)
	return true
}

// releaseStream frees a detached stream's place. A connection going away
// closes with its last stream.
func (cc *watchConn) releaseStream() {
	cc.mu.Lock()
	cc.used--
	idle := cc.goingAway && cc.used == 0 && cc.err == nil
	cc.mu.Unlock()
	if idle {
		_ = cc.conn.Close()
	}
}

// fail marks the connection failed with err, closes it and fails its
// open streams with err (retryable for those not answered yet).
func (cc *watchConn) fail(err error) {
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return
	}
	cc.err = err
	streams := cc.streams
	cc.streams = map[uint32]*watchConnStream{}
	for _, s := range streams {
		s.open = false
		cc.used--
	}
	cc.mu.Unlock()
	if cc.settings != nil {
		cc.closeSettings()
	}
	_ = cc.conn.Close()
	for _, s := range streams {
		s.end(err, true)
	}
}

// closeSettings closes the settings channel once.
func (cc *watchConn) closeSettings() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	select {
	case <-cc.settings:
	default:
		close(cc.settings)
	}
}

// stream returns the open stream id, or nil; a frame for a stream the
// client never opened is a connection error.
func (cc *watchConn) stream(id uint32) (*watchConnStream, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if s := cc.streams[id]; s != nil {
		return s, nil
	}
	if id%2 == 0 || id >= cc.nextID {
		return nil, http2.ConnectionError(http2.ErrCodeProtocol)
	}
	return nil, nil // ended or reset by the client: ignored
}

// readLoop reads the connection's frames until it fails, then fails the
// streams still open on it with an error that is not io.EOF.
func (cc *watchConn) readLoop() {
	var err error
	for err == nil {
		var f http2.Frame
		f, err = cc.fr.ReadFrame()
		var se http2.StreamError
		switch {
		case errors.As(err, &se):
			if s, _ := cc.stream(se.StreamID); s != nil {
				s.end(fmt.Errorf("watchgate: the API server's stream broke: %w", se), false)
				cc.resetStream(s, se.Code)
			}
			err = nil
		case err == nil:
			err = cc.handle(f)
		}
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	cc.fail(fmt.Errorf("watchgate: the API server's HTTP/2 connection broke: %w", err))
}

// handle processes one frame in the read loop; an error fails the
// connection.
func (cc *watchConn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		return cc.handleData(f)
	case *http2.MetaHeadersFrame:
		return cc.handleHeaders(f)
	case *http2.SettingsFrame:
		return cc.handleSettings(f)
	case *http2.PingFrame:
		if !f.IsAck() {
			data := f.Data
			cc.write(func() error { return cc.fr.WritePing(true, data) })
		}
	case *http2.GoAwayFrame:
		cc.handleGoAway(f.LastStreamID)
	case *http2.RSTStreamFrame:
		s, err := cc.stream(f.StreamID)
		if err != nil || s == nil {
			return err
		}
		cc.endStream(s)
		s.end(http2.StreamError{StreamID: f.StreamID, Code: f.ErrCode}, f.ErrCode == http2.ErrCodeRefusedStream)
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol) // push is disabled
	case *http2.WindowUpdateFrame:
		// The proxy sends no DATA; the framer validated the increment.
	}
	return nil
}

func (cc *watchConn) handleData(f *http2.DataFrame) error {
	n := int(f.Length)
	if n > cc.inflow {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	// The connection's credit goes back as DATA arrives, whether its
	// stream reads it or not: a slow client stalls only its own stream.
	cc.inflow -= n
	cc.unacked += n
	if cc.unacked >= watchConnCreditBytes {
		credit := cc.unacked
		cc.unacked = 0
		cc.inflow += credit
		cc.writeWindowUpdate(0, credit)
	}
	s, err := cc.stream(f.StreamID)
	if err != nil || s == nil {
		return err
	}
	if code := s.receive(f.Data(), n, f.StreamEnded()); code != 0 {
		s.end(fmt.Errorf("watchgate: the API server broke the HTTP/2 protocol on a watch stream: %v", code), false)
		cc.resetStream(s, code)
		return nil
	}
	if f.StreamEnded() {
		cc.endStream(s)
		s.stop()
	}
	return nil
}

func (cc *watchConn) handleHeaders(f *http2.MetaHeadersFrame) error {
	s, err := cc.stream(f.StreamID)
	if err != nil || s == nil {
		return err
	}
	streamErr := func(format string, args ...any) error {
		s.end(fmt.Errorf("watchgate: upstream response: "+format, args...), false)
		cc.resetStream(s, http2.ErrCodeProtocol)
		return nil
	}
	if f.Truncated {
		return streamErr("header list larger than %d bytes", upstreamMaxHeaderListBytes)
	}
	s.mu.Lock()
	trailers := s.gotResponse
	s.mu.Unlock()
	if trailers {
		if !f.StreamEnded() {
			return streamErr("trailers without END_STREAM")
		}
		s.receive(nil, 0, true) // trailers are not passed on
		cc.endStream(s)
		s.stop()
		return nil
	}
	status := f.PseudoValue("status")
	code, err := strconv.Atoi(status)
	if err != nil || len(status) != 3 || code < 100 {
		return streamErr("malformed :status %q", sampledlog.Bounded(status))
	}
	if code < 200 {
		if code == http.StatusSwitchingProtocols || f.StreamEnded() {
			return streamErr("unexpected %d", code)
		}
		return nil // 100 Continue, 103 Early Hints: the final answer follows
	}
	regular := f.RegularFields()
	header := make(http.Header, len(regular))
	// One backing array for the values, as x/net's transport does: most
	// fields are a header's only value.
	values := make([]string, len(regular))
	for _, hf := range regular {
		key := canonicalResponseHeader(hf.Name)
		if vv := header[key]; vv != nil {
			header[key] = append(vv, hf.Value)
			continue
		}
		vv := values[:1:1]
		values = values[1:]
		vv[0] = hf.Value
		header[key] = vv
	}
	contentLength := int64(-1)
	if vv := header["Content-Length"]; len(vv) == 1 {
		if n, err := strconv.ParseInt(vv[0], 10, 64); err == nil && n >= 0 {
			contentLength = n
		}
	}
	s.mu.Lock()
	s.status, s.header, s.contentLength, s.gotResponse = code, header, contentLength, true
	if f.StreamEnded() {
		s.eof = true
	}
	s.mu.Unlock()
	s.signal()
	if f.StreamEnded() {
		cc.endStream(s)
		s.stop()
	}
	return nil
}

func (cc *watchConn) handleSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	err := f.ForeachSetting(func(st http2.Setting) error {
		if err := st.Valid(); err != nil {
			return err
		}
		switch st.ID {
		case http2.SettingMaxConcurrentStreams:
			cc.mu.Lock()
			cc.maxStreams = int(min(st.Val, watchConnDefaultStreams))
			cc.mu.Unlock()
		case http2.SettingMaxFrameSize:
			cc.mu.Lock()
			cc.peerFrameSize = st.Val
			cc.mu.Unlock()
		case http2.SettingHeaderTableSize:
			cc.wmu.Lock()
			cc.henc.SetMaxDynamicTableSizeLimit(st.Val)
			cc.wmu.Unlock()
		}
		return nil
	})
	if err != nil {
		return err
	}
	cc.mu.Lock()
	first := !cc.sawSettings
	if first {
		cc.sawSettings = true
		if _, ok := f.Value(http2.SettingMaxConcurrentStreams); !ok {
			cc.maxStreams = watchConnDefaultStreams
		}
	}
	cc.mu.Unlock()
	cc.write(cc.fr.WriteSettingsAck)
	if first {
		cc.closeSettings()
	}
	return nil
}

// handleGoAway stops new streams on the connection and fails those the
// server will not process (above lastID), which may be sent again.
func (cc *watchConn) handleGoAway(lastID uint32) {
	cc.mu.Lock()
	cc.goingAway = true
	var unsent []*watchConnStream
	for id, s := range cc.streams {
		if id > lastID {
			unsent = append(unsent, s)
		}
	}
	cc.mu.Unlock()
	for _, s := range unsent {
		cc.endStream(s)
		s.end(errWatchStreamUnsent, true)
	}
	cc.mu.Lock()
	idle := cc.used == 0
	cc.mu.Unlock()
	if idle {
		_ = cc.conn.Close()
	}
}

// encodeWatchRequestHeaders hpack-encodes a GET without a body as Go's
// HTTP/2 transport would: pseudo-headers, the request's header fields in
// lower case without the hop-by-hop ones (Connection, Keep-Alive,
// Proxy-Connection, Transfer-Encoding, Upgrade; TE only as "trailers"),
// Accept-Encoding as the caller sent it (compressed streams pass through
// undecoded: watchgate inspects gzip itself). It fails on a header field
// HTTP/2 cannot carry, before encoding anything.
func encodeWatchRequestHeaders(enc *hpack.Encoder, req *http.Request) error {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	host, err := httpguts.PunycodeHostPort(host)
	if err != nil || !httpguts.ValidHostHeader(host) {
		return fmt.Errorf("watchgate: invalid upstream host %q", sampledlog.Bounded(host))
	}
	path := req.URL.RequestURI()
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("watchgate: invalid upstream path %q", sampledlog.Bounded(path))
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("watchgate: invalid header field name %q", sampledlog.Bounded(k))
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Errorf("watchgate: invalid header field value for %q", sampledlog.Bounded(k))
			}
		}
	}
	field := func(name, value string) { _ = enc.WriteField(hpack.HeaderField{Name: name, Value: value}) }
	field(":authority", host)
	field(":method", http.MethodGet)
	field(":path", path)
	field(":scheme", req.URL.Scheme)
	sawUA := false
	for k, vv := range req.Header {
		name := strings.ToLower(k)
		switch name {
		case "host", "content-length", "connection", "proxy-connection", "transfer-encoding", "upgrade", "keep-alive":
			continue
		case "te":
			for _, v := range vv {
				if strings.EqualFold(v, "trailers") {
					field("te", "trailers")
				}
			}
			continue
		case "user-agent":
			sawUA = true
			if len(vv) == 0 || vv[0] == "" {
				continue
			}
			vv = vv[:1]
		}
		for _, v := range vv {
			field(name, v)
		}
	}
	if !sawUA {
		field("user-agent", "Go-http-client/2.0")
	}
	return nil
}

// responseHeaders maps the lower-case names of the headers kube-apiserver
// answers a watch with to their canonical form, so that reading a
// response's headers does not build each name again. It is fixed: a name
// it does not hold is canonicalised as net/http does.
var responseHeaders = func() map[string]string {
	names := []string{
		"audit-id", "cache-control", "content-encoding", "content-length", "content-type", "date",
		"retry-after", "transfer-encoding", "vary", "warning", "x-content-type-options",
		"x-kubernetes-pf-flowschema-uid", "x-kubernetes-pf-prioritylevel-uid",
	}
	m := make(map[string]string, len(names))
	for _, n := range names {
		m[n] = http.CanonicalHeaderKey(n)
	}
	return m
}()

// canonicalResponseHeader is http.CanonicalHeaderKey(name), without
// building the names kube-apiserver sends on every watch.
func canonicalResponseHeader(name string) string {
	if c, ok := responseHeaders[name]; ok {
		return c
	}
	return http.CanonicalHeaderKey(name)
}
