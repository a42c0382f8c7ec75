package upstreamtest

import (
	"encoding/pem"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"
)

// H2Upstream is an HTTPS upstream speaking HTTP/2 with h, allowing
// streams per connection (0: Go's default); accepted counts its
// connections.
func H2Upstream(t testing.TB, streams int, h http.HandlerFunc) (up *httptest.Server, accepted *atomic.Int64) {
	t.Helper()
	up = httptest.NewUnstartedServer(h)
	up.EnableHTTP2 = true
	up.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: streams}
	up.Config.ErrorLog = log.New(io.Discard, "", 0)
	accepted = &atomic.Int64{}
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	up.StartTLS()
	t.Cleanup(up.Close)
	return up, accepted
}

// WatchUpstream is an HTTPS upstream speaking HTTP/2 that allows streams
// per connection and answers every request 200 with its headers flushed,
// then holds the stream until the client leaves or the test ends; its
// rest.Config trusts it, and accepted counts the connections it accepted.
func WatchUpstream(tb testing.TB, streams uint32) (up *httptest.Server, cfg *rest.Config, accepted *atomic.Int64) {
	tb.Helper()
	hold := make(chan struct{})
	up, accepted = H2Upstream(tb, int(streams), func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	})
	tb.Cleanup(func() { close(hold) })
	return up, Trusting(up), accepted
}

// Trusting is a rest.Config for the TLS server up that trusts its certificate.
func Trusting(up *httptest.Server) *rest.Config {
	return &rest.Config{Host: up.URL, TLSClientConfig: rest.TLSClientConfig{
		CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}),
	}}
}

// OpenAtOnce opens n watches at once with open and returns their bodies;
// any open that fails fails the test.
func OpenAtOnce(t *testing.T, n int, open func(i int) (*http.Response, error)) []io.Closer {
	t.Helper()
	var wg sync.WaitGroup
	bodies := make([]io.Closer, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			resp, err := open(i)
			if err != nil {
				errs[i] = err
				return
			}
			bodies[i] = resp.Body
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	return bodies
}
