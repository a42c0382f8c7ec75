package serve

import (
	"net"
	"os"
	"testing"
	"time"
)

// At the cap, Accept waits until a held connection closes; the freed
// place goes to the next client, and a connection closed twice frees one
// place only.
func TestLimitConnectionsHoldsTheCap(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitConnections(inner, 2, 0)
	defer ln.Close()
	accepted := make(chan net.Conn, 3)
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
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first, second := <-accepted, <-accepted
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted with the cap at 2")
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	first.Close()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the third connection was not accepted after one closed")
	}
	if n := len(ln.(*limitListener).slots); n != 2 {
		t.Errorf("%d places taken, want 2 (closing twice freed more than one)", n)
	}
	second.Close()
}

// A network that holds its share of the connections gets no more: its
// next connection is closed at once rather than queued. Another network
// still gets in, and a freed place goes back to the network.
func TestLimitConnectionsSharesPerNetwork(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitConnections(inner, 8, 2)
	defer ln.Close()
	accepted := make(chan net.Conn, 8)
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
	dialFrom := func(local string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		c, err := d.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	acceptedFrom := func(want string) net.Conn {
		t.Helper()
		select {
		case c := <-accepted:
			t.Cleanup(func() { c.Close() })
			if got := c.RemoteAddr().(*net.TCPAddr).IP.String(); got != want {
				t.Fatalf("accepted a connection from %s, want %s", got, want)
			}
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("the connection from %s was not accepted", want)
			return nil
		}
	}

	dialFrom("127.0.0.2")
	first := acceptedFrom("127.0.0.2")
	dialFrom("127.0.0.3")
	acceptedFrom("127.0.0.3")
	// 127.0.0.0/24 holds its two: its third is closed, not accepted.
	third := dialFrom("127.0.0.4")
	if err := third.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := third.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
		t.Errorf("a third connection from 127.0.0.0/24: read = %v, want it closed by the proxy", err)
	}
	// Another network gets in.
	dialFrom("127.0.1.2")
	acceptedFrom("127.0.1.2")
	// A place 127.0.0.0/24 frees is its own again.
	first.Close()
	dialFrom("127.0.0.5")
	acceptedFrom("127.0.0.5")
	l := ln.(*limitListener)
	l.mu.Lock()
	got := map[string]int{}
	for k, v := range l.byNetwork {
		got[k] = v
	}
	l.mu.Unlock()
	if got["127.0.0.0/24"] != 2 || got["127.0.1.0/24"] != 1 || len(got) != 2 {
		t.Errorf("connections per network = %v, want 127.0.0.0/24: 2, 127.0.1.0/24: 1", got)
	}
}
