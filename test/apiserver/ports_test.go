package apiserver

import (
	"net"
	"strconv"
	"testing"
)

// Addresses asked for in a row are never the same, they can be bound, and
// none is in the kernel's ephemeral range, where listeners on port 0 would
// be given it.
func TestFreeAddrNeverHandsOutAPortTwice(t *testing.T) {
	lo, hi := portRange()
	seen := map[string]bool{}
	for range 200 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		if port, _ := strconv.Atoi(p); port < lo || port >= hi {
			t.Errorf("%s: port outside [%d, %d)", addr, lo, hi)
		}
	}
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("bind %s: %v", addr, err)
	}
	l.Close()
	// Listeners on port 0 (envtest's, httptest's) draw from elsewhere, so
	// they never take a port between FreeAddr and the child's bind.
	for range 200 {
		other, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		other.Close()
		if port := other.Addr().(*net.TCPAddr).Port; port >= lo && port < hi {
			t.Fatalf("port 0 gave %d, inside FreeAddr's range [%d, %d)", port, lo, hi)
		}
	}
}

// Another process cannot take a port this one holds: the hold is an
// abstract socket named after the port, and a second bind of the name
// fails as it would in another process.
func TestFreeAddrHoldsItsPortsAgainstOtherProcesses(t *testing.T) {
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	if l, err := net.Listen("unix", "@watchgate-test-port-"+port); err == nil {
		l.Close()
		t.Fatalf("the hold of %s could be taken again", addr)
	}
}
