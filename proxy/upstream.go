package proxy

import (
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
	"k8s.io/client-go/rest"
)

// upstreamTransport returns the API server's URL and a transport that
// trusts the API server's CA and carries nothing else of cfg: no bearer
// token, no client certificate, no exec plugin, no impersonation. Upgrade
// requests (exec, attach, port-forward over SPDY or WebSocket) go over
// HTTP/1.1, everything else over HTTP/2 when the API server offers it.
func upstreamTransport(cfg *rest.Config) (*url.URL, http.RoundTripper, error) {
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
	h2 := &http.Transport{
		Proxy:                 proxyFunc,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 0, // watches and long lists answer when they answer
		MaxIdleConnsPerHost:   100,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
		// Pass Accept-Encoding and compressed bodies through untouched.
		DisableCompression: true,
	}
	h1 := h2.Clone()
	h1.ForceAttemptHTTP2 = false
	h1.Protocols = new(http.Protocols)
	h1.Protocols.SetHTTP1(true)
	if h1.TLSClientConfig != nil {
		h1.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	return target, upgradeAwareTransport{normal: h2, upgrade: h1}, nil
}

// upgradeAwareTransport sends upgrade requests over HTTP/1.1, the only
// protocol where Upgrade exists.
type upgradeAwareTransport struct {
	normal, upgrade http.RoundTripper
}

func (t upgradeAwareTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if httpguts.HeaderValuesContainsToken(r.Header["Connection"], "Upgrade") {
		return t.upgrade.RoundTrip(r)
	}
	return t.normal.RoundTrip(r)
}

// forwardedHeaders are the caller's proxy headers, which Rewrite strips and
// the proxy puts back (strip nothing but hop-by-hop headers).
var forwardedHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// newReverseProxy forwards to target through transport. Responses are
// flushed on every write, so watch events reach the client as they come;
// 101 Switching Protocols is handled by ReverseProxy itself. Admitted
// watches' bodies are wrapped to learn from them (watchBody).
func newReverseProxy(target *url.URL, transport http.RoundTripper, errorLog *log.Logger, logs *sampledLogger) *httputil.ReverseProxy {
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
		BufferPool:    copyBuffers{},
		FlushInterval: -1,
		ErrorLog:      errorLog,
		ModifyResponse: func(resp *http.Response) error {
			if ws := admittedWatchFrom(resp.Request.Context()); ws != nil {
				ws.upstreamAnswered(resp)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			stopped := false
			if ws := admittedWatchFrom(r.Context()); ws != nil {
				stopped = ws.upstreamFailed()
			}
			switch {
			case stopped:
				writeStatus(w, r, serviceUnavailable(shuttingDownMessage, 1))
			case errors.Is(err, http.ErrAbortHandler), r.Context().Err() != nil:
				// The client left; nobody to answer.
			default:
				logs.Info("Cannot reach the API server", "method", r.Method, "path", boundedForLog(r.URL.Path), "err", err.Error())
				writeStatus(w, r, serviceUnavailable("the API server is unreachable through watchgate, please try again", 1))
			}
		},
	}
}

// copyBufferBytes is the size of the buffer the forwarder copies a
// response body through, ReverseProxy's own default.
const copyBufferBytes = 32 << 10

// copyBufferPool recycles the forwarder's copy buffers. Without it
// ReverseProxy allocates one per response: 32 KiB of garbage for every GET
// and every watch open, the largest allocation of a request (~29 KB of
// the ~50 KB the proxy allocated per watch open without the pool).
var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, copyBufferBytes); return &b }}

// copyBuffers is an httputil.BufferPool over copyBufferPool.
type copyBuffers struct{}

func (copyBuffers) Get() []byte { return *copyBufferPool.Get().(*[]byte) }

func (copyBuffers) Put(b []byte) {
	if cap(b) == copyBufferBytes {
		b = b[:copyBufferBytes]
		copyBufferPool.Put(&b)
	}
}

// logWriter turns the standard library's log lines (http.Server,
// ReverseProxy) into sampled logr lines.
type logWriter struct{ logs *sampledLogger }

func (l logWriter) Write(p []byte) (int, error) {
	l.logs.Info("HTTP", "message", strings.TrimSpace(string(p)))
	return len(p), nil
}
