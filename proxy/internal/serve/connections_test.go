package serve

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// listenLimited serves LimitConnections(n, perNetwork, unauthTimeout) on
// loopback; accepted receives what Accept returns.
func listenLimited(t *testing.T, n, perNetwork int, unauthTimeout time.Duration) (*limitListener, string, chan net.Conn) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitConnections(inner, n, perNetwork, unauthTimeout)
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, n+1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	return ln.(*limitListener), inner.Addr().String(), accepted
}

func dialFrom(t *testing.T, addr, local string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func acceptedFrom(t *testing.T, accepted chan net.Conn, want string) *limitedConn {
	t.Helper()
	select {
	case c := <-accepted:
		t.Cleanup(func() { c.Close() })
		if got := c.RemoteAddr().(*net.TCPAddr).IP.String(); got != want {
			t.Fatalf("accepted a connection from %s, want %s", got, want)
		}
		return c.(*limitedConn)
	case <-time.After(10 * time.Second):
		t.Fatalf("the connection from %s was not accepted", want)
		return nil
	}
}

// closedByProxy fails unless the proxy closed c (the client reads EOF).
func closedByProxy(t *testing.T, c net.Conn, what string) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
		t.Errorf("%s: read = %v, want it closed by the proxy", what, err)
	}
}

func (l *limitListener) counts() (open, unauth int, byNetwork map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	byNetwork = map[string]int{}
	for k, v := range l.byNetwork {
		byNetwork[k] = v.open
	}
	return l.open, l.unauth, byNetwork
}

// At the cap, with every connection authenticated, Accept waits until a
// held connection closes; the freed place goes to the next client, and a
// connection closed twice frees one place only.
func TestLimitConnectionsHoldsTheCap(t *testing.T) {
	l, addr, accepted := listenLimited(t, 2, 0, 0)
	for range 2 {
		dialFrom(t, addr, "127.0.0.1")
	}
	first, second := acceptedFrom(t, accepted, "127.0.0.1"), acceptedFrom(t, accepted, "127.0.0.1")
	first.authenticate()
	second.authenticate()
	dialFrom(t, addr, "127.0.0.1")
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted with the cap at 2, both authenticated")
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	first.Close()
	acceptedFrom(t, accepted, "127.0.0.1")
	if open, _, _ := l.counts(); open != 2 {
		t.Errorf("%d places taken, want 2 (closing twice freed more than one)", open)
	}
}

// At the cap, a new connection takes the place of the oldest connection
// on which nothing authenticated, from the network holding the most; an
// authenticated one is never shed.
func TestLimitConnectionsShedsUnauthenticatedFirst(t *testing.T) {
	l, addr, accepted := listenLimited(t, 4, 0, 0)
	var held []net.Conn
	for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.1.2"} {
		held = append(held, dialFrom(t, addr, ip))
		c := acceptedFrom(t, accepted, ip)
		if ip == "127.0.0.2" || ip == "127.0.1.2" {
			c.authenticate()
		}
	}
	dialFrom(t, addr, "127.0.2.2")
	acceptedFrom(t, accepted, "127.0.2.2")
	closedByProxy(t, held[1], "the oldest unauthenticated connection of the network holding the most")
	open, unauth, byNetwork := l.counts()
	if open != 4 || unauth != 2 || byNetwork["127.0.0.0/24"] != 2 {
		t.Errorf("open %d, unauthenticated %d, by network %v; want 4, 2 (127.0.0.4 and the new one), 127.0.0.0/24 holding 2", open, unauth, byNetwork)
	}
}

// The share per network applies only near the cap (its last quarter):
// below it a network's neighbour is accepted whatever the network holds;
// near it the network's new connection takes the place of its own oldest
// unauthenticated one, and is closed when it has none.
func TestLimitConnectionsSharesPerNetworkNearTheCap(t *testing.T) {
	l, addr, accepted := listenLimited(t, 8, 2, 0)
	var neighbours []*limitedConn
	var held []net.Conn
	for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		held = append(held, dialFrom(t, addr, ip))
		neighbours = append(neighbours, acceptedFrom(t, accepted, ip))
	}
	// Four of 127.0.0.0/24, twice its share, with 4 places free.
	for _, ip := range []string{"127.0.1.2", "127.0.1.3"} {
		dialFrom(t, addr, ip)
		acceptedFrom(t, accepted, ip).authenticate()
	}
	// 2 places free: near the cap. 127.0.0.0/24 sheds its own oldest.
	dialFrom(t, addr, "127.0.0.6")
	acceptedFrom(t, accepted, "127.0.0.6").authenticate()
	closedByProxy(t, held[0], "127.0.0.0/24's oldest unauthenticated connection, near the cap")
	// With all its connections authenticated, its next is closed at once.
	for _, c := range neighbours[1:] {
		c.authenticate()
	}
	closedByProxy(t, dialFrom(t, addr, "127.0.0.7"), "a connection of a network at its share near the cap, all authenticated")
	// Another network still gets in.
	dialFrom(t, addr, "127.0.2.2")
	acceptedFrom(t, accepted, "127.0.2.2")
	if _, _, byNetwork := l.counts(); byNetwork["127.0.0.0/24"] != 4 || byNetwork["127.0.1.0/24"] != 2 || byNetwork["127.0.2.0/24"] != 1 {
		t.Errorf("connections per network = %v, want 127.0.0.0/24: 4, 127.0.1.0/24: 2, 127.0.2.0/24: 1", byNetwork)
	}
}

// A connection on which nothing authenticated is closed after the
// timeout; an authenticated one stays.
func TestLimitConnectionsClosesUnauthenticatedConnections(t *testing.T) {
	l, addr, accepted := listenLimited(t, 4, 0, 50*time.Millisecond)
	idle := dialFrom(t, addr, "127.0.0.2")
	acceptedFrom(t, accepted, "127.0.0.2")
	valid := dialFrom(t, addr, "127.0.0.3")
	acceptedFrom(t, accepted, "127.0.0.3").authenticate()
	closedByProxy(t, idle, "a connection on which nothing authenticated")
	if open, unauth, _ := l.counts(); open != 1 || unauth != 0 {
		t.Errorf("open %d, unauthenticated %d after the timeout; want 1 and 0", open, unauth)
	}
	if err := valid.SetReadDeadline(time.Now().Add(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := valid.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
		t.Error("the authenticated connection was closed")
	}
}
