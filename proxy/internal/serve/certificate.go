package serve

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"

	"k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// Certificate is where the TLS server gets its certificate: files
// reloaded when they change (certwatcher), or a pair generated at start.
type Certificate struct {
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Watch runs until ctx ends; nil for a generated pair.
	Watch func(ctx context.Context) error
	// GeneratedCA is the PEM of the generated pair's certificates (serving
	// certificate and its self-signed CA); empty for files.
	GeneratedCA []byte
}

// NewCertificate returns the certificate in certFile and keyFile, reloaded
// when they change, or, when certFile is empty, a self-signed pair
// generated now for localhost, watchgate, the host name and the loopback
// addresses.
func NewCertificate(certFile, keyFile string) (*Certificate, error) {
	if certFile != "" {
		w, err := certwatcher.New(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load serving certificate: %w", err)
		}
		return &Certificate{GetCertificate: w.GetCertificate, Watch: w.Start}, nil
	}
	host, _ := os.Hostname()
	dns := []string{"localhost", "watchgate"}
	if host != "" {
		dns = append(dns, host)
	}
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("watchgate", []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, dns)
	if err != nil {
		return nil, fmt.Errorf("generate serving certificate: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("generated serving certificate: %w", err)
	}
	return &Certificate{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &pair, nil },
		GeneratedCA:    certPEM,
	}, nil
}
