package serve

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/watchgate/watchgate/proxy/internal/authn"
)

// DefaultMaxConnections is main's --max-connections: room for 4,000
// watches over HTTP/1.1 (one connection each) and a thousand more for
// everything else. client-go multiplexes its watches over one HTTP/2
// connection, so agents use a handful, and their watches are held to
// --max-watches, not to this.
const DefaultMaxConnections = 5000

// UnauthenticatedTimeout is how long a connection may stay open without a
// request on it authenticating: past it the connection is closed. It
// leaves room for the headers (ReadHeaderTimeout, 10 s) and a TokenReview
// (ReviewTimeout, 10 s); a client that sends no credentials, or only
// refused ones, holds a place this long instead of the 2-minute idle
// timeout.
const UnauthenticatedTimeout = 20 * time.Second

var (
	openConnections = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_connections",
		Help: "Client connections the proxy holds open; at --max-connections new ones wait in the kernel's accept queue.",
	})
	refusedConnections = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "watchgate_proxy_connections_refused_total",
		Help: "Client connections closed at once because their network (IPv4 /24, IPv6 /64) held its share of --max-connections near the cap, none of them unauthenticated.",
	})
	shedConnections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_connections_shed_total",
		Help: "Client connections on which no request authenticated, closed by reason (unauthenticated: open longer than 20 s; cap: to make room for a new connection at --max-connections or at its network's share).",
	}, []string{"reason"})
	shedUnauthenticated = shedConnections.WithLabelValues("unauthenticated")
	shedAtCap           = shedConnections.WithLabelValues("cap")
)

func init() { metrics.Registry.MustRegister(openConnections, refusedConnections, shedConnections) }

// ConnectionsPerNetworkDivisor derives the connections one client network
// may hold near the cap: a quarter of --max-connections, so that one
// network (a node's pods, clients behind one SNAT, one IPv6 /64) never
// takes them all. Near the cap is the last quarter of the places.
const ConnectionsPerNetworkDivisor = 4

// limitListener accepts at most max connections at once, and sheds the
// connections on which no request has authenticated (unauthenticated)
// first:
//
//   - an unauthenticated connection is closed UnauthenticatedTimeout
//     after it was accepted;
//   - at the cap, a new connection takes the place of the oldest
//     unauthenticated connection of the network holding the most
//     connections;
//     with none, Accept waits until a connection closes, so further
//     clients wait in the kernel's accept queue (and time out there)
//     instead of each costing the process a goroutine, TLS state and
//     buffers;
//   - near the cap (its last quarter) a network (authn.NetworkOf) holding
//     perNetwork connections gets a new one only in place of its own
//     oldest unauthenticated connection; with none, the new connection is
//     closed at once. While more places are free, every connection is
//     accepted, so a network's idle neighbours never close a valid
//     client's connection.
//
// State: one entry per network holding a connection, so at most max
// entries. It is safe for concurrent use.
type limitListener struct {
	net.Listener
	max, perNetwork int // perNetwork 0: no share per network
	unauthTimeout   time.Duration

	mu        sync.Mutex
	freed     *sync.Cond // a place was freed
	open      int
	unauth    int // open connections on which nothing authenticated
	byNetwork map[string]*networkConns
}

// networkConns is what one network holds: its open connections, and those
// on which nothing authenticated, oldest first.
type networkConns struct {
	open   int
	oldest *limitedConn // first of the unauthenticated list
	newest *limitedConn
}

// LimitConnections wraps ln with a cap of n connections, at most
// perNetwork of them from one network near the cap (0: no such share),
// closing connections on which nothing authenticated within
// unauthTimeout (0: never); n <= 0 returns ln unchanged. Requests mark
// their connection authenticated through the context ConnContext gives
// them.
func LimitConnections(ln net.Listener, n, perNetwork int, unauthTimeout time.Duration) net.Listener {
	if n <= 0 {
		return ln
	}
	l := &limitListener{Listener: ln, max: n, perNetwork: perNetwork, unauthTimeout: unauthTimeout, byNetwork: map[string]*networkConns{}}
	l.freed = sync.NewCond(&l.mu)
	return l
}

// ConnContext is http.Server's ConnContext for a server on a listener
// LimitConnections made: a request that authenticates on the connection
// marks it (authn.ConnectionAuthenticated).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitedConn); ok {
		return authn.WithConnection(ctx, lc.authenticate)
	}
	return ctx
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		for l.open >= l.max && l.unauth == 0 {
			l.freed.Wait()
		}
		l.mu.Unlock()
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := l.admit(c); lc != nil {
			return lc, nil
		}
	}
}

// admit gives c a place, shedding an unauthenticated connection if it
// must, waiting for a place when there is none to shed; nil when c was
// closed (its network holds its share near the cap).
func (l *limitListener) admit(c net.Conn) *limitedConn {
	network := authn.NetworkOf(c.RemoteAddr().String())
	l.mu.Lock()
	var victim *limitedConn
	for {
		nw := l.byNetwork[network]
		if l.perNetwork > 0 && nw != nil && nw.open >= l.perNetwork && l.max-l.open <= l.max/ConnectionsPerNetworkDivisor {
			if victim = nw.oldest; victim == nil {
				l.mu.Unlock()
				_ = c.Close()
				refusedConnections.Inc()
				return nil
			}
			break
		}
		if l.open < l.max {
			break
		}
		if victim = l.mostUnauthenticated(); victim != nil {
			break
		}
		l.freed.Wait()
	}
	if victim != nil {
		l.releaseLocked(victim)
	}
	nw := l.byNetwork[network]
	if nw == nil {
		nw = &networkConns{}
		l.byNetwork[network] = nw
	}
	lc := &limitedConn{Conn: c, l: l, nw: nw, network: network}
	l.open++
	l.unauth++
	nw.open++
	nw.push(lc)
	if l.unauthTimeout > 0 {
		lc.timer = time.AfterFunc(l.unauthTimeout, lc.expire)
	}
	l.mu.Unlock()
	openConnections.Inc()
	if victim != nil {
		_ = victim.Conn.Close()
		shedAtCap.Inc()
	}
	return lc
}

// mostUnauthenticated is the oldest unauthenticated connection of the
// network holding the most connections; nil when there is none. l.mu is
// held.
func (l *limitListener) mostUnauthenticated() *limitedConn {
	var best *networkConns
	for _, nw := range l.byNetwork {
		if nw.oldest != nil && (best == nil || nw.open > best.open) {
			best = nw
		}
	}
	if best == nil {
		return nil
	}
	return best.oldest
}

// releaseLocked frees c's place, once. l.mu is held.
func (l *limitListener) releaseLocked(c *limitedConn) {
	if c.released {
		return
	}
	c.released = true
	if c.timer != nil {
		c.timer.Stop()
	}
	l.open--
	c.nw.open--
	if !c.authed.Load() {
		l.unauth--
		c.nw.unlink(c)
	}
	if c.nw.open == 0 {
		delete(l.byNetwork, c.network)
	}
	openConnections.Dec()
	l.freed.Broadcast()
}

// limitedConn gives its place back once, on the first Close or when it is
// shed.
type limitedConn struct {
	net.Conn
	l       *limitListener
	nw      *networkConns
	network string
	authed  atomic.Bool // written under l.mu
	timer   *time.Timer
	// Guarded by l.mu.
	released   bool
	prev, next *limitedConn // in nw's unauthenticated list
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return err
}

// authenticate marks c: a request on it authenticated, so it is no longer
// shed first. Every authenticated request calls it; all but the first
// return after one atomic load.
func (c *limitedConn) authenticate() {
	if c.authed.Load() {
		return
	}
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.authed.Load() || c.released {
		return
	}
	c.authed.Store(true)
	c.l.unauth--
	c.nw.unlink(c)
	if c.timer != nil {
		c.timer.Stop()
	}
}

// expire closes c if nothing authenticated on it yet.
func (c *limitedConn) expire() {
	c.l.mu.Lock()
	if c.authed.Load() || c.released {
		c.l.mu.Unlock()
		return
	}
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	_ = c.Conn.Close()
	shedUnauthenticated.Inc()
}

// push appends c to the unauthenticated list.
func (nw *networkConns) push(c *limitedConn) {
	c.prev, c.next = nw.newest, nil
	if nw.newest != nil {
		nw.newest.next = c
	} else {
		nw.oldest = c
	}
	nw.newest = c
}

// unlink takes c out of the unauthenticated list.
func (nw *networkConns) unlink(c *limitedConn) {
	if c.prev != nil {
		c.prev.next = c.next
	} else if nw.oldest == c {
		nw.oldest = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else if nw.newest == c {
		nw.newest = c.prev
	}
	c.prev, c.next = nil, nil
}
