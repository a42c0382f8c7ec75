package upstream

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http/httpguts"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
)

// NewTransport returns the API server's URL and a transport that
// trusts the API server's CA and carries nothing else of cfg: no bearer
// token, no client certificate, no exec plugin, no impersonation. Upgrade
// requests (exec, attach, port-forward over SPDY or WebSocket) go over
// HTTP/1.1, everything else over HTTP/2 when the API server offers it.
//
// Requests from every caller share the HTTP/2 connections (upstreamPool),
// and admitted watches theirs (watchClient, watchgate's own HTTP/2 client,
// through the same dialer and TLS). When all of a connection's streams
// are taken (the API server's --http2-max-streams-per-connection), the
// next request opens another connection rather than wait for a stream to
// end (a watch may not end for an hour): StrictMaxConcurrentRequests is
// false; the requests that come meanwhile wait for that one dial. conns
// counts the connections open, both pools'.
func NewTransport(cfg *rest.Config, conns *ConnectionCount, watches WatchLookup) (*url.URL, http.RoundTripper, error) {
	target, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("upstream URL: %w", err)
	}
	caOnly := &rest.Config{Host: cfg.Host, TLSClientConfig: rest.TLSClientConfig{
		Insecure:   cfg.Insecure,
		ServerName: cfg.ServerName,
		CAFile:     cfg.CAFile,
		CAData:     cfg.CAData,
	}}
	tlsConfig, err := rest.TLSConfigFor(caOnly)
	if err != nil {
		return nil, nil, fmt.Errorf("upstream TLS: %w", err)
	}
	proxyFunc := http.ProxyFromEnvironment
	if cfg.Proxy != nil {
		proxyFunc = cfg.Proxy
	}
	dial := conns.dialer(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second})
	h2 := &http.Transport{
		Proxy:                 proxyFunc,
		DialContext:           dial,
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 0, // watches and long lists answer when they answer
		MaxIdleConnsPerHost:   100,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
		// Pass Accept-Encoding and compressed bodies through untouched.
		DisableCompression: true,
		HTTP2: &http.HTTP2Config{
			StrictMaxConcurrentRequests:   false,
			MaxReceiveBufferPerStream:     upstreamStreamWindowBytes,
			MaxReceiveBufferPerConnection: upstreamConnectionWindowBytes,
		},
	}
	h1 := h2.Clone()
	h1.ForceAttemptHTTP2 = false
	h1.Protocols = new(http.Protocols)
	h1.Protocols.SetHTTP1(true)
	if h1.TLSClientConfig != nil {
		h1.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	t := Transport{normal: newUpstreamPool(h2), upgrade: h1, admitted: watches}
	// Admitted watches go over watchgate's own HTTP/2 client (watchClient),
	// which speaks HTTP/2 over TLS directly to the API server: not to an
	// API server reached through an HTTP proxy (cfg.Proxy, or
	// HTTPS_PROXY from the environment), nor over plain HTTP. Their
	// watches stay on net/http.
	if target.Scheme == "https" {
		if u, err := proxyFunc(&http.Request{URL: target}); err == nil && u == nil {
			t.watches = newWatchClient(dial, tlsConfig, h2.IdleConnTimeout)
		}
	}
	return target, t, nil
}

// ConnectionCount counts the proxy's open TCP connections to the API
// server (HTTP/2 connections carrying many requests each, and one per
// upgraded or HTTP/1.1 request), in the gauge upstreamConnections too.
type ConnectionCount struct{ Open atomic.Int64 }

// dialer wraps d's DialContext so that the connections it makes are
// counted until they close.
func (c *ConnectionCount) dialer(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c.Open.Add(1)
		upstreamConnections.Inc()
		return &countedConn{Conn: conn, count: c}, nil
	}
}

// countedConn leaves the count on its first Close.
type countedConn struct {
	net.Conn
	count  *ConnectionCount
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.count.Open.Add(-1)
		upstreamConnections.Dec()
	}
	return c.Conn.Close()
}

var upstreamConnections = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "watchgate_proxy_upstream_connections",
	Help: "TCP connections open from this replica to the API server (HTTP/2 carries up to the API server's " +
		"--http2-max-streams-per-connection watches on each).",
})

func init() { metrics.Registry.MustRegister(upstreamConnections) }

// Transport sends upgrade requests over HTTP/1.1, the only
// protocol where Upgrade exists, admitted watches over watchgate's own
// HTTP/2 client (watches; nil when it cannot reach the API server) and
// everything else over net/http's HTTP/2 (normal).
type Transport struct {
	normal, upgrade http.RoundTripper
	watches         *watchClient
	admitted        WatchLookup // nil: no request is an admitted watch
}

// CloseIdleConnections closes the transports' connections that carry
// no request.
func (t Transport) CloseIdleConnections() {
	if t.watches != nil {
		t.watches.CloseIdleConnections()
	}
	for _, rt := range []http.RoundTripper{t.normal, t.upgrade} {
		if c, ok := rt.(interface{ CloseIdleConnections() }); ok {
			c.CloseIdleConnections()
		}
	}
}

// RoundTrip sends r over the transport its kind takes: upgrades over
// HTTP/1.1, admitted watches and accounted requests (an admitted list:
// WithBufferAccount) over the watch client, the rest over net/http's
// HTTP/2.
func (t Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if httpguts.HeaderValuesContainsToken(r.Header["Connection"], "Upgrade") {
		return t.upgrade.RoundTrip(r)
	}
	if t.watches != nil && r.URL.Scheme == "https" && r.Method == http.MethodGet && (r.Body == nil || r.Body == http.NoBody) &&
		(BufferAccountFrom(r.Context()) != nil || t.admitted != nil && t.admitted(r.Context()) != nil) {
		return t.watches.RoundTrip(r)
	}
	return t.normal.RoundTrip(r)
}

// AdmittedWatch is an admitted watch, as the forwarder reports to it what
// the API server answered.
type AdmittedWatch interface {
	// UpstreamAnswered sees the API server's response before the
	// reverse proxy sends its headers.
	UpstreamAnswered(resp *http.Response)
	// UpstreamFailed learns that the API server did not answer; it
	// reports whether the proxy itself closed the watch (shutdown).
	UpstreamFailed() (stoppedByProxy bool)
}

// WatchLookup returns the admitted watch a request is, nil for every
// other request.
type WatchLookup func(ctx context.Context) AdmittedWatch

// forwardedHeaders are the caller's proxy headers, which Rewrite strips and
// the proxy puts back (strip nothing but hop-by-hop headers).
var forwardedHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// NewReverseProxy forwards to target through transport. Responses are
// flushed on every write, so watch events reach the client as they come;
// 101 Switching Protocols is handled by ReverseProxy itself. An admitted
// watch's 200 stream is wrapped to learn from it (watchBody) and relayed
// after the reverse proxy has sent the headers (relay.Watch.relay).
func NewReverseProxy(target *url.URL, transport http.RoundTripper, errorLog *log.Logger, logs *sampledlog.Logger, watches WatchLookup) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			for _, h := range forwardedHeaders {
				if v, ok := pr.In.Header[h]; ok {
					pr.Out.Header[h] = v
				}
			}
			if ip, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
				if prior := pr.Out.Header.Get("X-Forwarded-For"); prior != "" {
					ip = prior + ", " + ip
				}
				pr.Out.Header.Set("X-Forwarded-For", ip)
			}
		},
		Transport:     transport,
		BufferPool:    CopyBuffers{},
		FlushInterval: -1,
		ErrorLog:      errorLog,
		ModifyResponse: func(resp *http.Response) error {
			countThrottled(resp)
			if ws := watches(resp.Request.Context()); ws != nil {
				ws.UpstreamAnswered(resp)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			stopped := false
			if ws := watches(r.Context()); ws != nil {
				stopped = ws.UpstreamFailed()
			}
			switch {
			case stopped:
				answer.WriteStatus(w, r, answer.ServiceUnavailable(answer.ShuttingDownMessage, 1))
			case errors.Is(err, http.ErrAbortHandler), r.Context().Err() != nil:
				// The client left; nobody to answer.
			default:
				logs.Info("Cannot reach the API server", "method", r.Method, "path", sampledlog.Bounded(r.URL.Path), "err", err.Error())
				answer.WriteStatus(w, r, answer.ServiceUnavailable("the API server is unreachable through watchgate, please try again", 1))
			}
		},
	}
}

// CopyBufferBytes is the size of the buffer the forwarder copies a
// response body through, ReverseProxy's own default.
const CopyBufferBytes = 32 << 10

// copyBufferPool recycles the forwarder's copy buffers, and the relay's
// while a watch's bytes flow (copyWatch). Without it ReverseProxy
// allocates one per response: 32 KiB of garbage for every GET and every
// watch open, the largest allocation of a request (~29 KB of the ~50 KB
// the proxy allocated per watch open without the pool).
var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, CopyBufferBytes); return &b }}

// CopyBuffers is an httputil.BufferPool over copyBufferPool.
type CopyBuffers struct{}

// Get returns a buffer of CopyBufferBytes from the pool.
func (CopyBuffers) Get() []byte { return *copyBufferPool.Get().(*[]byte) }

// Put returns b to the pool when it has the pool's capacity, and drops
// any other buffer.
func (CopyBuffers) Put(b []byte) {
	if cap(b) == CopyBufferBytes {
		b = b[:CopyBufferBytes]
		copyBufferPool.Put(&b)
	}
}
