package apiserver

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// FreeAddr returns a loopback address for a server that a test starts in
// another process (or through flags): a port that nothing listens on now
// and that no other caller, in this process or in another test process on
// the machine, is given until this process exits.
//
// Closing a listener on port 0 and passing its port on is not enough: the
// kernel may hand the same port to the next listen on port 0, so that two
// addresses asked for in a row (a child's metrics and health probe) were
// the same, and the child failed with "bind: address already in use". A
// port from FreeAddr instead
//   - lies below the kernel's ephemeral range (ip_local_port_range), which
//     listeners on port 0 and outgoing connections draw from, so that no
//     other server of the test bed (envtest's etcd and kube-apiserver,
//     httptest) is given it between this call and the child's bind;
//   - is held, for the life of the process, by an abstract Unix socket
//     named after it, which the kernel releases when the process exits, so
//     that two test processes never hand out the same port and one process
//     never hands it out twice.
//
// So the port stays the caller's until its child binds it, or until the
// caller gives up and asks again.
func FreeAddr() (string, error) {
	ports.Lock()
	defer ports.Unlock()
	lo, hi := portRange()
	for range maxPortTries {
		port := lo + rand.IntN(hi-lo)
		if ports.held[port] {
			continue
		}
		hold, err := net.Listen("unix", fmt.Sprintf("@watchgate-test-port-%d", port))
		if err != nil {
			continue // another test process holds it
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			// Taken by something that is not ours; keep the hold so that it
			// is not tried again.
			ports.keep(port, hold)
			continue
		}
		if err := l.Close(); err != nil {
			return "", err
		}
		ports.keep(port, hold)
		return l.Addr().String(), nil
	}
	return "", fmt.Errorf("no free loopback port in [%d, %d) after %d tries", lo, hi, maxPortTries)
}

// maxPortTries bounds FreeAddr's search; the range holds thousands of ports
// and a test process asks for tens.
const maxPortTries = 1000

// ports are the ports FreeAddr handed out (or found taken) in this process.
var ports = portHolds{held: map[int]bool{}}

// portHolds are ports with the sockets that hold them; the sockets are
// never closed, so the ports stay held until the process exits.
type portHolds struct {
	sync.Mutex
	held  map[int]bool
	holds []net.Listener
}

// keep records port as handed out and keeps its hold open; p is locked.
func (p *portHolds) keep(port int, hold net.Listener) {
	p.held[port] = true
	p.holds = append(p.holds, hold)
}

// portRange is the range FreeAddr draws from: the ports below the kernel's
// ephemeral range, [10000, 32768) with Linux's default range; the ports
// above it when it starts too low to leave room below.
func portRange() (lo, hi int) {
	first, last, err := ephemeralRange()
	switch {
	case err != nil:
		return 10000, 32768
	case first >= 11000:
		return 10000, first
	case last <= 64535:
		return last + 1, 65536
	default:
		return 10000, 32768
	}
}

// ephemeralRange reads the kernel's ephemeral port range.
func ephemeralRange() (first, last int, err error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, err
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, 0, errors.New("ip_local_port_range: want two ports")
	}
	if first, err = strconv.Atoi(fields[0]); err != nil {
		return 0, 0, err
	}
	last, err = strconv.Atoi(fields[1])
	return first, last, err
}
