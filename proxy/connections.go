package proxy

import (
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// DefaultMaxConnections is main's --max-connections: room for
// DefaultMaxWatches watches over HTTP/1.1 (one connection each) and a
// thousand more for everything else. client-go multiplexes its watches
// over one HTTP/2 connection, so agents use a handful.
const DefaultMaxConnections = DefaultMaxWatches + 1000

var openConnections = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "watchgate_proxy_connections",
	Help: "Client connections the proxy holds open; at --max-connections new ones wait in the kernel's accept queue.",
})

func init() { metrics.Registry.MustRegister(openConnections) }

// limitListener accepts at most n connections at once: Accept blocks while
// n are open, and a connection frees its place when it is closed, so
// further clients wait in the kernel's accept queue (and time out there)
// instead of each costing the process a goroutine, TLS state and buffers.
type limitListener struct {
	net.Listener
	slots chan struct{}
}

// limitConnections wraps ln; n <= 0 returns ln unchanged.
func limitConnections(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, slots: make(chan struct{}, n)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	openConnections.Inc()
	return &limitedConn{Conn: c, release: func() { openConnections.Dec(); <-l.slots }}, nil
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
