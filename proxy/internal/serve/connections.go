package serve

import (
	"net"
	"sync"

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

var (
	openConnections = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_connections",
		Help: "Client connections the proxy holds open; at --max-connections new ones wait in the kernel's accept queue.",
	})
	refusedConnections = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "watchgate_proxy_connections_refused_total",
		Help: "Client connections closed at once because their network (IPv4 /24, IPv6 /64) held its share of --max-connections.",
	})
)

func init() { metrics.Registry.MustRegister(openConnections, refusedConnections) }

// ConnectionsPerNetworkDivisor derives the connections one client network
// may hold: a quarter of --max-connections, so that one network (a node's
// pods, clients behind one SNAT, one IPv6 /64) never takes them all.
const ConnectionsPerNetworkDivisor = 4

// limitListener accepts at most n connections at once: Accept blocks while
// n are open, and a connection frees its place when it is closed, so
// further clients wait in the kernel's accept queue (and time out there)
// instead of each costing the process a goroutine, TLS state and buffers.
// A connection from a network (networkOf) that already holds perNetwork
// of them is closed at once instead, so that one network cannot fill the
// queue's head for everyone. State: one count per network holding a
// connection, so at most n entries of at most 64 bytes.
type limitListener struct {
	net.Listener
	slots      chan struct{}
	perNetwork int // 0: no share per network

	mu        sync.Mutex
	byNetwork map[string]int // guarded by mu
}

// LimitConnections wraps ln with a cap of n connections, at most
// perNetwork of them from one network (0: no such share); n <= 0 returns
// ln unchanged.
func LimitConnections(ln net.Listener, n, perNetwork int) net.Listener {
	if n <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), perNetwork: perNetwork, byNetwork: map[string]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		l.slots <- struct{}{}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		network := authn.NetworkOf(c.RemoteAddr().String())
		if !l.take(network) {
			c.Close()
			<-l.slots
			refusedConnections.Inc()
			continue
		}
		openConnections.Inc()
		return &limitedConn{Conn: c, release: func() { openConnections.Dec(); l.give(network); <-l.slots }}, nil
	}
}

// take counts a connection of network, unless it holds its share.
func (l *limitListener) take(network string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perNetwork > 0 && l.byNetwork[network] >= l.perNetwork {
		return false
	}
	l.byNetwork[network]++
	return true
}

// give uncounts a connection of network.
func (l *limitListener) give(network string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.byNetwork[network] - 1; n > 0 {
		l.byNetwork[network] = n
	} else {
		delete(l.byNetwork, network)
	}
}

// limitedConn gives its place back once, on the first Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
