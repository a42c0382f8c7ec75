package upstream

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// upstreamPruneInterval is how often the pool looks for broken and idle
// connections, when a request looks for a stream.
const upstreamPruneInterval = 10 * time.Second

// upstreamDialTimeout bounds one connection's dial and TLS handshake,
// whoever waits for it.
const upstreamDialTimeout = 40 * time.Second

// upstreamPool is the forwarder's pool of connections to the API server:
// an http.RoundTripper that sends each request on a connection with a
// free stream (an HTTP/2 connection carries up to the server's
// --http2-max-streams-per-connection) and dials one connection at a time
// per address when none has one; every request that finds no free stream
// meanwhile waits for that dial instead of starting its own.
//
// http.Transport dials a connection for every request that finds its
// HTTP/2 connections full and keeps the first, closing the others: when
// an agent restarts and opens its thousands of watches at once, each
// burst that fills a connection costs hundreds of TLS handshakes, for
// the proxy and for the API server (2,000 watches opened at once over
// connections of 100 streams: 350–470 connections dialed for the 20
// kept; BenchmarkIdleWatches). Here the same burst dials 20.
//
// Connections come from transport.NewClientConn, with its TLS, HTTP/2
// settings, dialer and proxy. A connection that failed is dropped when a
// request's search meets it or at the next prune, and one with no request
// in flight and none begun for IdleConnTimeout is closed at a prune: every
// upstreamPruneInterval when a request looks for a stream. A request
// takes a stream on the newest connection that has one: the search costs
// one lock per connection looked at, and the newest are the ones with
// free streams.
type upstreamPool struct {
	transport *http.Transport
	idle      time.Duration
	now       func() time.Time

	mu     sync.Mutex
	conns  map[string][]*pooledConn // by scheme and address, oldest first
	dials  map[string]*poolDial     // the dial in progress, by scheme and address
	pruned time.Time                // when pruneLocked last ran
}

type pooledConn struct {
	cc       *http.ClientConn
	lastUsed time.Time // the last reservation; guarded by upstreamPool.mu
}

// poolDial is a dial in progress and the new connection's first request.
type poolDial struct {
	pool *upstreamPool
	key  string

	dialed chan struct{} // closed when the dial ended; cc and err set
	cc     *http.ClientConn
	err    error

	claimed   bool // a request has the new connection's first stream; guarded by pool.mu
	published sync.Once
	done      chan struct{} // closed when the connection joined the pool
}

func newUpstreamPool(t *http.Transport) *upstreamPool {
	return &upstreamPool{
		transport: t, idle: t.IdleConnTimeout, now: time.Now,
		conns: map[string][]*pooledConn{}, dials: map[string]*poolDial{},
	}
}

// upstreamAttempts bounds how often one request is sent again after its
// stream was refused or its connection broke before it was sent.
const upstreamAttempts = 5

// upstreamSettingsWait bounds how long a new connection serves only its
// first request (see reserve).
const upstreamSettingsWait = time.Second

func (p *upstreamPool) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		cc, first, err := p.reserve(req.Context(), req.URL.Scheme, canonicalAddr(req.URL.Scheme, req.URL.Host))
		if err != nil {
			return nil, err
		}
		resp, err := cc.RoundTrip(req)
		if first != nil {
			first.publish()
		}
		if err != nil && attempt < upstreamAttempts && req.Context().Err() == nil && (req.Body == nil || req.Body == http.NoBody) &&
			(cc.Err() != nil || refusedStream(err)) {
			continue
		}
		return resp, err
	}
}

// refusedStream reports whether the server refused a request's HTTP/2
// stream (REFUSED_STREAM: it did not process it, so it may be sent again).
// The error's type is unexported; its text carries the code's name.
func refusedStream(err error) bool {
	return strings.Contains(err.Error(), "REFUSED_STREAM")
}

// reserve returns a connection to addr with a stream reserved for the
// caller, dialing one when none has a free stream. A new connection
// serves its first request alone, and joins the pool once that request
// has its response headers, or after upstreamSettingsWait: until the
// server's SETTINGS arrive the client assumes 100 streams, and a server
// that allows fewer would keep the requests sent beyond its limit waiting
// for a free stream, for as long as a watch lives. first, when not nil,
// is that new connection, to publish after the request.
func (p *upstreamPool) reserve(ctx context.Context, scheme, addr string) (cc *http.ClientConn, first *poolDial, err error) {
	key := scheme + "://" + addr
	for {
		p.mu.Lock()
		if cc := p.reserveLocked(key); cc != nil {
			p.mu.Unlock()
			return cc, nil, nil
		}
		d := p.dials[key]
		if d == nil {
			d = &poolDial{pool: p, key: key, dialed: make(chan struct{}), done: make(chan struct{})}
			p.dials[key] = d
			go d.dial(scheme, addr)
		}
		p.mu.Unlock()
		select {
		case <-d.dialed:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		if d.err != nil {
			return nil, nil, d.err
		}
		p.mu.Lock()
		if !d.claimed && d.cc.Reserve() == nil {
			d.claimed = true
			p.mu.Unlock()
			return d.cc, d, nil
		}
		p.mu.Unlock()
		select {
		case <-d.done:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// reserveLocked reserves a stream on the newest connection to key that
// has one (the older ones are full, or emptying and soon idle), after
// pruning the pool when it was last pruned upstreamPruneInterval ago.
// p.mu is held.
func (p *upstreamPool) reserveLocked(key string) *http.ClientConn {
	now := p.now()
	if now.Sub(p.pruned) >= upstreamPruneInterval {
		p.pruneLocked(now)
	}
	conns := p.conns[key]
	defer func() {
		if len(conns) == 0 {
			delete(p.conns, key)
		} else {
			p.conns[key] = conns
		}
	}()
	for i := len(conns) - 1; i >= 0; i-- {
		c := conns[i]
		if c.cc.Reserve() == nil {
			c.lastUsed = now
			return c.cc
		}
		if c.cc.Err() != nil {
			// Broken (an HTTP/1.1 connection closes with the stream a
			// client cancelled): dropped now, so that the search does
			// not grow with the connections broken since the last prune.
			_ = c.cc.Close()
			conns = slices.Delete(conns, i, i+1)
		}
	}
	return nil
}

// pruneLocked closes and drops the connections that broke, and those
// idle (no request in flight, none begun for the transport's
// IdleConnTimeout). p.mu is held.
func (p *upstreamPool) pruneLocked(now time.Time) {
	p.pruned = now
	for key, conns := range p.conns {
		kept := conns[:0]
		for _, c := range conns {
			if c.cc.Err() != nil || (p.idle > 0 && c.cc.InFlight() == 0 && now.Sub(c.lastUsed) > p.idle) {
				_ = c.cc.Close()
				continue
			}
			kept = append(kept, c)
		}
		clear(conns[len(kept):])
		if len(kept) == 0 {
			delete(p.conns, key)
		} else {
			p.conns[key] = kept
		}
	}
}

// dial opens the connection the requests waiting on d share: dialed
// closes when it is open (or err set), done when it has joined the pool.
func (d *poolDial) dial(scheme, addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), upstreamDialTimeout)
	defer cancel()
	cc, err := d.pool.transport.NewClientConn(ctx, scheme, addr)
	d.cc, d.err = cc, err
	close(d.dialed)
	if err != nil {
		d.publish()
		return
	}
	time.AfterFunc(upstreamSettingsWait, d.publish)
}

// publish ends the dial: the connection, if any, joins the pool, and
// the requests waiting for it look again.
func (d *poolDial) publish() {
	d.published.Do(func() {
		p := d.pool
		p.mu.Lock()
		delete(p.dials, d.key)
		if d.err == nil {
			p.conns[d.key] = append(p.conns[d.key], &pooledConn{cc: d.cc, lastUsed: p.now()})
		}
		p.mu.Unlock()
		close(d.done)
	})
}

// CloseIdleConnections closes the connections with no request in flight.
func (p *upstreamPool) CloseIdleConnections() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, conns := range p.conns {
		kept := conns[:0]
		for _, c := range conns {
			if c.cc.Err() != nil || c.cc.InFlight() == 0 {
				_ = c.cc.Close()
				continue
			}
			kept = append(kept, c)
		}
		clear(conns[len(kept):])
		p.conns[key] = kept
	}
}

// canonicalAddr is host:port of a URL's host, the scheme's port added
// when it has none.
func canonicalAddr(scheme, host string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	if scheme == "http" {
		return net.JoinHostPort(strings.Trim(host, "[]"), "80")
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), "443")
}
