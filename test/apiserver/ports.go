package apiserver

import "net"

// FreeAddr returns a loopback address whose port nothing listens on right
// now, for a server a test starts in another process (or through flags).
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
