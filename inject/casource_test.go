package inject

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/util/cert"
)

// A CA file that also holds a private key (a tls.crt+tls.key bundle
// mounted by mistake, or a Secret's keys concatenated) publishes its
// certificates only.
func TestCASourcePublishesCertificatesOnly(t *testing.T) {
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("watchgate", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalECPrivateKey(key)
	other := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	file := filepath.Join(t.TempDir(), "ca.crt")
	bundle := bytes.Join([][]byte{[]byte("# a comment\n"), keyPEM, certPEM, other}, nil)
	if err := os.WriteFile(file, bundle, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := (&CASource{File: file}).Load()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(got, []byte("PRIVATE KEY")) || bytes.Contains(got, []byte("comment")) {
		t.Errorf("published bundle keeps more than certificates:\n%s", got)
	}
	n := 0
	for rest := got; ; n++ {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			if len(bytes.TrimSpace(rest)) != 0 {
				t.Errorf("published bundle ends in %q", rest)
			}
			break
		}
		if blk.Type != "CERTIFICATE" {
			t.Errorf("published bundle holds a %s block", blk.Type)
		}
	}
	if want := bytes.Count(certPEM, []byte("BEGIN CERTIFICATE")); n != want {
		t.Errorf("published %d certificates, want the file's %d", n, want)
	}
	if _, err := (&CASource{Static: keyPEM}).Load(); err == nil {
		t.Error("a bundle with only a key loaded")
	}
}
