package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/util/cert"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/serve"
)

// The server speaks HTTP/2 and HTTP/1.1 over TLS with a generated
// certificate, answers unauthenticated requests itself, limits header
// size, is ready only while serving with a ready upstream, and drops
// readiness first on shutdown.
func TestServerLifecycle(t *testing.T) {
	upstream := tlsUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz", "/.well-known/openid-configuration", "/openid/v1/jwks": // probe, service-account keys
		case "/api/v1/serviceaccounts", "/api/v1/pods", "/api/v1/nodes": // the watches of the objects tokens are bound to
			if r.URL.Query().Get("limit") != "1" && r.URL.Query().Get("watch") != "true" {
				t.Errorf("upstream request %s, want a list of one object or a watch", r.URL)
			}
		default:
			t.Errorf("unexpected upstream request %s", r.URL.Path)
		}
	}))
	upstream.Username, upstream.Password = "", ""
	srv, err := NewServer(Options{
		BindAddress: "127.0.0.1:0", Upstream: upstream, Engine: &enginetest.Engine{},
		MaxHeaderBytes: 4 << 10, ShutdownDrainDelay: 200 * time.Millisecond, ShutdownGracePeriod: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if srv.ReadyCheck(nil) == nil {
		t.Error("ready before Start")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for srv.ReadyCheck(nil) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %v", srv.ReadyCheck(nil))
		}
		time.Sleep(10 * time.Millisecond)
	}

	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(srv.GeneratedCertificate()) {
		t.Fatal("no generated certificate")
	}
	url := "https://" + srv.Addr().String() + "/api/v1/pods"
	for _, h2 := range []bool{true, false} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: h2}
		if !h2 {
			tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
		}
		client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if wantProto := map[bool]int{true: 2, false: 1}[h2]; resp.StatusCode != 401 || resp.ProtoMajor != wantProto {
			t.Errorf("HTTP/%d %d, want HTTP/%d 401", resp.ProtoMajor, resp.StatusCode, wantProto)
		}
		if !h2 {
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Header.Set("X-Big", strings.Repeat("x", 8<<10))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
				t.Errorf("huge header: HTTP %d, want 431", resp.StatusCode)
			}
		}
		tr.CloseIdleConnections()
	}

	cancel()
	time.Sleep(50 * time.Millisecond) // within the drain delay; not an assertion
	if srv.ReadyCheck(nil) == nil {
		t.Error("still ready while shutting down")
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Errorf("Start returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return after shutdown")
	}
}

// A serving certificate given as files is reloaded when the files change.
func TestServingCertificateReloads(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func(host string) {
		certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey(host, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	served := func(sc *serve.Certificate) string {
		c, err := sc.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return parsed.Subject.CommonName
	}
	write("first")
	sc, err := serve.NewCertificate(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = sc.Watch(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if got := served(sc); !strings.HasPrefix(got, "first") {
		t.Fatalf("serving %q, want the first certificate", got)
	}
	write("second")
	deadline := time.Now().Add(20 * time.Second)
	for !strings.HasPrefix(served(sc), "second") {
		if time.Now().After(deadline) {
			t.Fatalf("still serving %q 20s after the files changed", served(sc))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
