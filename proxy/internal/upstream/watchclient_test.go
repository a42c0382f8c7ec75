package upstream

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watchgate/watchgate/proxy/internal/upstreamtest"
)

// watchClientFor returns the watch client upstreamTransport builds for
// the HTTPS upstream up, and the count of connections it dials.
func watchClientFor(t *testing.T, up *httptest.Server) (*watchClient, *ConnectionCount) {
	t.Helper()
	conns := &ConnectionCount{}
	_, transport, err := NewTransport(upstreamtest.Trusting(up), conns, nil)
	if err != nil {
		t.Fatal(err)
	}
	wc := transport.(Transport).watches
	if wc == nil {
		t.Fatal("no watch client for an HTTPS upstream")
	}
	t.Cleanup(wc.CloseIdleConnections)
	return wc, conns
}

func watchRequest(t *testing.T, ctx context.Context, up *httptest.Server, path string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, up.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// checkNoGoroutineLeak fails the test when, after it and its cleanups,
// more goroutines run than before it.
func checkNoGoroutineLeak(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		for range 200 {
			if runtime.NumGoroutine() <= before {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after the test, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
	})
}

// The request's header fields reach the API server as Go's HTTP/2
// transport sends them (hop-by-hop fields dropped, TE only as trailers,
// Accept-Encoding as the caller sent it), and the response comes back as
// a net/http response: canonical header, HTTP/2.0, TLS, unknown length,
// a gzip-encoded body passed undecoded, io.EOF after END_STREAM.
func TestWatchClientHeadersAndBody(t *testing.T) {
	checkNoGoroutineLeak(t)
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = zw.Write([]byte(`{"type":"ADDED","object":{}}` + "\n"))
	_ = zw.Close()
	got := make(chan http.Header, 1)
	up, _ := upstreamtest.H2Upstream(t, 0, func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		h.Set("X-Method", r.Method)
		h.Set("X-Host", r.Host)
		h.Set("X-URI", r.RequestURI)
		got <- h
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header()["x-lower"] = []string{"a", "b"}
		w.Header()["Warning"] = []string{`299 - "one"`, `299 - "two"`}
		w.Header().Set("Audit-Id", "42")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // no Content-Length
		_, _ = w.Write(zipped.Bytes())
	})
	wc, _ := watchClientFor(t, up)
	req := watchRequest(t, context.Background(), up, "/api/v1/configmaps?watch=true&resourceVersion=7")
	req.Header.Set("Accept-Encoding", "gzip")
	req.Header.Set("Authorization", "Bearer alice")
	req.Header["Impersonate-Extra-Scopes"] = []string{"one", "two"}
	req.Header.Set("Connection", "keep-alive")
	req.Header.Set("Keep-Alive", "timeout=5")
	req.Header.Set("Proxy-Connection", "keep-alive")
	req.Header.Set("Transfer-Encoding", "chunked")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Te", "trailers")
	req.Header.Set("User-Agent", "")
	resp, err := wc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	h := <-got
	for k, want := range map[string]string{
		"X-Method": "GET", "X-Host": strings.TrimPrefix(up.URL, "https://"),
		"X-Uri":                    "/api/v1/configmaps?watch=true&resourceVersion=7",
		"Accept-Encoding":          "gzip",
		"Authorization":            "Bearer alice",
		"Impersonate-Extra-Scopes": "one,two",
		"Te":                       "trailers",
	} {
		if g := strings.Join(h.Values(k), ","); g != want {
			t.Errorf("the upstream got %s %q, want %q", k, g, want)
		}
	}
	for _, k := range []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "User-Agent"} {
		if v, ok := h[k]; ok {
			t.Errorf("the upstream got %s %q, want none", k, v)
		}
	}
	if resp.StatusCode != http.StatusOK || resp.Status != "200 OK" || resp.Proto != "HTTP/2.0" || resp.ProtoMajor != 2 ||
		resp.TLS == nil || resp.ContentLength != -1 || resp.Request != req {
		t.Errorf("response %d %q %s TLS %v length %d request %p, want 200 OK over HTTP/2.0 and TLS, length -1, request %p",
			resp.StatusCode, resp.Status, resp.Proto, resp.TLS != nil, resp.ContentLength, resp.Request, req)
	}
	if g := strings.Join(resp.Header.Values("X-Lower"), ","); g != "a,b" || resp.Header.Get("Content-Encoding") != "gzip" {
		t.Errorf("response header %v, want X-Lower a,b and Content-Encoding gzip", resp.Header)
	}
	// Names the client knows and names it does not, one value or more:
	// a second value never lands in another header's place.
	for k, want := range map[string]string{"Warning": `299 - "one"|299 - "two"`, "Audit-Id": "42", "Content-Type": "application/json"} {
		if g := strings.Join(resp.Header[k], "|"); g != want {
			t.Errorf("response header %s %q, want %q (all: %v)", k, g, want, resp.Header)
		}
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.Equal(body, zipped.Bytes()) {
		t.Errorf("body %q, %v; want the gzip bytes as sent, then io.EOF", body, err)
	}
	_ = resp.Body.Close()

	// A user agent the caller did not set is Go's, as net/http sends it.
	req = watchRequest(t, context.Background(), up, "/")
	resp, err = wc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if ua := (<-got).Get("User-Agent"); ua != "Go-http-client/2.0" {
		t.Errorf("User-Agent %q", ua)
	}
}

// A stream the API server resets fails its read with an error, not
// io.EOF; a connection the API server closes fails every stream on it.
func TestWatchClientStreamAndConnectionFailures(t *testing.T) {
	checkNoGoroutineLeak(t)
	up, _ := upstreamtest.H2Upstream(t, 0, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("event\n"))
		w.(http.Flusher).Flush()
		if r.URL.Path == "/reset" {
			panic(http.ErrAbortHandler) // RST_STREAM
		}
		<-r.Context().Done()
	})
	wc, conns := watchClientFor(t, up)
	open := func(path string) io.ReadCloser {
		t.Helper()
		resp, err := wc.RoundTrip(watchRequest(t, context.Background(), up, path))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Body
	}
	readUntilError := func(body io.Reader) ([]byte, error) {
		var got []byte
		buf := make([]byte, 64)
		for {
			n, err := body.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				return got, err
			}
		}
	}

	reset := open("/reset")
	got, err := readUntilError(reset)
	if err == nil || errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "stream error") {
		t.Errorf("a reset stream read %q, then %v; want the reset", got, err)
	}
	_ = reset.Close()

	bodies := []io.ReadCloser{open("/a"), open("/b"), open("/c")}
	if n := conns.Open.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	for _, b := range bodies {
		buf := make([]byte, 6)
		if _, err := io.ReadFull(b, buf); err != nil {
			t.Fatal(err)
		}
	}
	up.CloseClientConnections()
	for i, b := range bodies {
		if _, err := readUntilError(b); err == nil || errors.Is(err, io.EOF) {
			t.Errorf("watch %d on a closed connection ended with %v, want an error", i, err)
		}
		_ = b.Close()
	}
	// The next watch goes over a new connection.
	b := open("/d")
	_ = b.Close()
}

// The request context's end resets the stream, which the API server's
// handler sees, and fails the read with the context's error; Close resets
// a stream the API server has not ended and frees it.
func TestWatchClientCancelAndClose(t *testing.T) {
	checkNoGoroutineLeak(t)
	ended := make(chan string, 4)
	up, _ := upstreamtest.H2Upstream(t, 0, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		ended <- r.URL.Path
	})
	wc, _ := watchClientFor(t, up)

	ctx, cancel := context.WithCancel(context.Background())
	resp, err := wc.RoundTrip(watchRequest(t, ctx, up, "/cancelled"))
	if err != nil {
		t.Fatal(err)
	}
	readErr := make(chan error, 1)
	go func() { _, err := resp.Body.Read(make([]byte, 1)); readErr <- err }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-readErr; !errors.Is(err, context.Canceled) {
		t.Errorf("the read of a cancelled watch ended with %v, want %v", err, context.Canceled)
	}
	waitForEnd(t, ended, "/cancelled")
	_ = resp.Body.Close()

	resp, err = wc.RoundTrip(watchRequest(t, context.Background(), up, "/closed"))
	if err != nil {
		t.Fatal(err)
	}
	s := resp.Body.(*watchConnStream)
	_ = resp.Body.Close()
	waitForEnd(t, ended, "/closed")
	if _, err := resp.Body.Read(make([]byte, 1)); err == nil {
		t.Error("a read after Close succeeded")
	}
	// The cancelled stream's place is freed by its context's AfterFunc
	// right after its RST_STREAM is written, which the upstream may see
	// first: wait for it.
	var streams, used int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.cc.mu.Lock()
		streams, used = len(s.cc.streams), s.cc.used
		s.cc.mu.Unlock()
		if (streams == 0 && used == 0) || time.Now().After(deadline) {
			break
		}
	}
	if streams != 0 || used != 0 {
		t.Errorf("after Close the connection holds %d streams, %d used; want none", streams, used)
	}

	// A context that ended before the request: the request fails with it.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := wc.RoundTrip(watchRequest(t, ctx, up, "/early")); !errors.Is(err, context.Canceled) {
		t.Errorf("a request with an ended context: %v", err)
	}
}

func waitForEnd(t *testing.T, ch <-chan string, want string) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Errorf("%s ended, want %s", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the upstream handler of %s did not see its stream end", want)
	}
}

// More watches than a connection's stream limit are all answered at once,
// over more connections dialed one at a time.
func TestWatchClientHonoursMaxConcurrentStreams(t *testing.T) {
	checkNoGoroutineLeak(t)
	const watches, streams = 23, 5
	up, accepted := upstreamtest.H2Upstream(t, streams, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	wc, conns := watchClientFor(t, up)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bodies := upstreamtest.OpenAtOnce(t, watches, func(i int) (*http.Response, error) {
		return wc.RoundTrip(watchRequest(t, ctx, up, fmt.Sprintf("/w%d", i)))
	})
	want := int64((watches + streams - 1) / streams)
	if got := accepted.Load(); got != want {
		t.Errorf("%d connections accepted for %d watches of %d per connection, want %d", got, watches, streams, want)
	}
	if got := conns.Open.Load(); got != want {
		t.Errorf("%d connections counted, want %d", got, want)
	}
	for _, b := range bodies {
		_ = b.Close()
	}
}

// Watches that close and reopen on a full connection never take the API
// server over its stream limit: a closed watch's RST_STREAM reaches the
// server before the HEADERS of the watch that takes its place (a Go
// server answers a stream over its acknowledged limit PROTOCOL_ERROR).
func TestWatchClientChurnStaysWithinTheStreamLimit(t *testing.T) {
	checkNoGoroutineLeak(t)
	const streams, workers, rounds = 2, 4, 300
	up, accepted := upstreamtest.H2Upstream(t, streams, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	wc, _ := watchClientFor(t, up)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := wc.RoundTrip(watchRequest(t, ctx, up, fmt.Sprintf("/w%d-%d", w, i)))
				if err != nil {
					cancel()
					errs <- fmt.Errorf("watch %d of worker %d: %w", i, w, err)
					return
				}
				if i%2 == 0 {
					_ = resp.Body.Close() // RST_STREAM from Close
				}
				cancel() // RST_STREAM from the request's end
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d connections for %d watches, %d at a time of %d per connection", accepted.Load(), workers*rounds, workers, streams)
}

// A watch whose client does not read holds at most its stream's initial
// window (64 KiB, not the 1 MiB a stream's window grows to) and stalls no
// other watch on the same connection; a stream whose client reads grows
// its window to the most, and the bytes waiting are reported to the
// request's BufferAccount.
func TestWatchClientSlowReaderStallsNoOtherStream(t *testing.T) {
	checkNoGoroutineLeak(t)
	const size = 3 * upstreamStreamWindowBytes
	up, _ := upstreamtest.H2Upstream(t, 0, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	wc, conns := watchClientFor(t, up)
	var lastWindow atomic.Int64
	account := &countingAccount{}
	stalled, err := wc.RoundTrip(watchRequest(t, WithBufferAccount(context.Background(), account), up, "/stalled"))
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Body.Close()
	for i := range 3 {
		resp, err := wc.RoundTrip(watchRequest(t, context.Background(), up, fmt.Sprintf("/reader%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil || n != size {
			t.Fatalf("reader %d got %d bytes, %v; want %d", i, n, err, size)
		}
		rs := resp.Body.(*watchConnStream)
		rs.mu.Lock()
		lastWindow.Store(int64(rs.window))
		rs.mu.Unlock()
		_ = resp.Body.Close()
	}
	if n := conns.Open.Load(); n != 1 {
		t.Errorf("%d connections, want all streams on one", n)
	}
	s := stalled.Body.(*watchConnStream)
	s.mu.Lock()
	buffered := s.buffered
	s.mu.Unlock()
	if buffered > upstreamInitialStreamWindowBytes || buffered == 0 {
		t.Errorf("the unread stream buffers %d bytes, want some and at most its initial window %d", buffered, upstreamInitialStreamWindowBytes)
	}
	if got := account.n.Load(); got != int64(buffered) {
		t.Errorf("the account counts %d bytes, want the %d buffered", got, buffered)
	}
	if window := lastWindow.Load(); window != upstreamMaxStreamWindowBytes {
		t.Errorf("a reader's stream window grew to %d, want %d", window, upstreamMaxStreamWindowBytes)
	}
	n, err := io.Copy(io.Discard, stalled.Body)
	if err != nil || n != size {
		t.Errorf("the stalled watch, read at last, got %d bytes, %v; want %d", n, err, size)
	}
}

// An API server that does not negotiate HTTP/2 fails the watch clearly.
func TestWatchClientRequiresHTTP2(t *testing.T) {
	checkNoGoroutineLeak(t)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	up.Config.ErrorLog = log.New(io.Discard, "", 0)
	up.StartTLS() // HTTP/1.1 only
	t.Cleanup(up.Close)
	wc, conns := watchClientFor(t, up)
	_, err := wc.RoundTrip(watchRequest(t, context.Background(), up, "/"))
	if err == nil || !strings.Contains(err.Error(), "HTTP/2") {
		t.Errorf("a watch to an HTTP/1.1 server: %v, want an error naming HTTP/2", err)
	}
	if n := conns.Open.Load(); n != 0 {
		t.Errorf("%d connections left open", n)
	}
}

// countingAccount is a BufferAccount that counts.
type countingAccount struct{ n atomic.Int64 }

func (a *countingAccount) AddBuffered(delta int) { a.n.Add(int64(delta)) }
