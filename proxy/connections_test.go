package proxy

import (
	"net"
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
	ln := limitConnections(inner, 2)
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
