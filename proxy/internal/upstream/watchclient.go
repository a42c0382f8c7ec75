package upstream

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// watchClient is the http.RoundTripper for admitted watches (GET, no
// body, no upgrade): a pool of watchConns, watchgate's own minimal HTTP/2
// client, so that an open watch costs the proxy no goroutine and little
// heap on the upstream side (watchConn says why). Every other request
// goes through upstreamPool and net/http as before.
//
// Its pooling is upstreamPool's: a request takes a stream on the newest
// connection that has one; when none has, one connection is dialed per
// address at a time, and the requests that find no free stream meanwhile
// wait for that dial instead of starting their own. A new connection
// joins the pool once the server's SETTINGS came (its stream limit,
// SETTINGS_MAX_CONCURRENT_STREAMS: kube-apiserver's
// --http2-max-streams-per-connection), or after upstreamSettingsWait;
// until they come it serves one request. Broken connections, those going
// away and empty, and those idle for idle are closed when a request looks
// for a stream, every upstreamPruneInterval. A request the API server did
// not process (REFUSED_STREAM, GOAWAY below its stream, the connection
// broke before an answer) is sent again, up to upstreamAttempts times.
//
// Dials go through the same counted dialer and TLS (the API server's CA,
// ALPN h2 required) as the rest of the upstream transport.
type watchClient struct {
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	tlsConfig *tls.Config
	idle      time.Duration
	now       func() time.Time

	mu     sync.Mutex
	conns  map[string][]*watchConn // by address, oldest first
	dials  map[string]*watchDial   // the dial in progress, by address
	pruned time.Time
}

// watchDial is a connection being dialed; done closes when it joined the
// pool (cc) or failed (err).
type watchDial struct {
	done chan struct{}
	cc   *watchConn
	err  error
}

func newWatchClient(dial func(ctx context.Context, network, addr string) (net.Conn, error), tlsConfig *tls.Config, idle time.Duration) *watchClient {
	cfg := &tls.Config{}
	if tlsConfig != nil {
		cfg = tlsConfig.Clone()
	}
	cfg.NextProtos = []string{"h2"}
	return &watchClient{
		dial: dial, tlsConfig: cfg, idle: idle, now: time.Now,
		conns: map[string][]*watchConn{}, dials: map[string]*watchDial{},
	}
}

func (c *watchClient) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" || req.Method != http.MethodGet || (req.Body != nil && req.Body != http.NoBody) {
		return nil, fmt.Errorf("watchgate: the watch client sends only GETs without a body over https, not %s %s", req.Method, req.URL.Scheme)
	}
	addr := canonicalAddr(req.URL.Scheme, req.URL.Host)
	for attempt := 1; ; attempt++ {
		// A request whose context has already ended is never sent: a
		// stream sent anyway could be answered before its cancel lands.
		if err := req.Context().Err(); err != nil {
			return nil, err
		}
		cc, err := c.reserve(req.Context(), addr)
		if err != nil {
			return nil, err
		}
		resp, retry, err := cc.roundTrip(req)
		if err != nil && retry && attempt < upstreamAttempts && req.Context().Err() == nil {
			continue
		}
		return resp, err
	}
}

// reserve returns a connection to addr with a stream reserved for the
// caller, dialing one when none has a free stream.
func (c *watchClient) reserve(ctx context.Context, addr string) (*watchConn, error) {
	for {
		c.mu.Lock()
		if cc := c.reserveLocked(addr); cc != nil {
			c.mu.Unlock()
			return cc, nil
		}
		d := c.dials[addr]
		if d == nil {
			d = &watchDial{done: make(chan struct{})}
			c.dials[addr] = d
			go c.dialConn(d, addr)
		}
		c.mu.Unlock()
		select {
		case <-d.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if d.err != nil {
			return nil, d.err
		}
	}
}

// reserveLocked reserves a stream on the newest connection to addr that
// has one, after pruning the pool when it was last pruned
// upstreamPruneInterval ago. c.mu is held.
func (c *watchClient) reserveLocked(addr string) *watchConn {
	now := c.now()
	if now.Sub(c.pruned) >= upstreamPruneInterval {
		c.pruneLocked(now, false)
	}
	conns := c.conns[addr]
	for i := len(conns) - 1; i >= 0; i-- {
		if conns[i].reserve(now) {
			return conns[i]
		}
	}
	return nil
}

// pruneLocked closes and drops the connections that failed or go away
// with no stream left, and those with no stream and none reserved for
// longer than the idle timeout (all: every one without a stream). c.mu
// is held.
func (c *watchClient) pruneLocked(now time.Time, all bool) {
	c.pruned = now
	for addr, conns := range c.conns {
		kept := conns[:0]
		for _, cc := range conns {
			unusable, empty, lastUsed := cc.state()
			if empty && (unusable || all || c.idle > 0 && now.Sub(lastUsed) > c.idle) {
				cc.close()
				continue
			}
			kept = append(kept, cc)
		}
		clear(conns[len(kept):])
		if len(kept) == 0 {
			delete(c.conns, addr)
		} else {
			c.conns[addr] = kept
		}
	}
}

// dialConn dials addr for the requests waiting on d, and adds the
// connection to the pool once its SETTINGS came (or after
// upstreamSettingsWait).
func (c *watchClient) dialConn(d *watchDial, addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), upstreamDialTimeout)
	defer cancel()
	cc, err := c.connect(ctx, addr)
	if err == nil {
		wait := time.NewTimer(upstreamSettingsWait)
		select {
		case <-cc.settings:
		case <-wait.C:
		}
		wait.Stop()
		// A connection that failed before its SETTINGS fails the
		// requests waiting for it, rather than send them dialing again.
		cc.mu.Lock()
		err = cc.err
		cc.mu.Unlock()
		if err != nil {
			cc = nil
		}
	}
	c.mu.Lock()
	delete(c.dials, addr)
	if err == nil {
		c.conns[addr] = append(c.conns[addr], cc)
	}
	d.cc, d.err = cc, err
	c.mu.Unlock()
	close(d.done)
}

// connect dials addr, negotiates TLS with ALPN h2 and starts HTTP/2.
func (c *watchClient) connect(ctx context.Context, addr string) (*watchConn, error) {
	raw, err := c.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	cfg := c.tlsConfig
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		host, _, _ := net.SplitHostPort(addr)
		cfg.ServerName = host
	}
	conn := tls.Client(raw, cfg)
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("watchgate: TLS handshake with the API server at %s, offering HTTP/2 only (h2, which watches need): %w", addr, err)
	}
	state := conn.ConnectionState()
	if state.NegotiatedProtocol != "h2" {
		_ = raw.Close()
		return nil, fmt.Errorf("watchgate: the API server at %s does not speak HTTP/2 (ALPN %q), which watches need", addr, state.NegotiatedProtocol)
	}
	return newWatchConn(conn, &state, c.now())
}

// CloseIdleConnections closes the connections that carry no watch.
func (c *watchClient) CloseIdleConnections() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pruneLocked(c.now(), true)
}
