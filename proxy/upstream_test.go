package proxy

import (
	"bufio"
	"crypto/tls"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
)

// tlsUpstream is an HTTPS upstream that offers HTTP/2, asks for (but does
// not require) client certificates, and returns a rest.Config that trusts
// it and also carries the proxy's own credentials of every kind.
func tlsUpstream(t *testing.T, h http.Handler) *rest.Config {
	t.Helper()
	up := httptest.NewUnstartedServer(h)
	up.EnableHTTP2 = true
	up.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	up.StartTLS()
	t.Cleanup(up.Close)
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("proxy-client", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &rest.Config{
		Host:            up.URL,
		BearerToken:     "proxy-own-token",
		Username:        "proxy",
		Password:        "secret",
		Impersonate:     rest.ImpersonationConfig{UserName: "proxy-impersonates"},
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}), CertData: certPEM, KeyData: keyPEM},
	}
}

// The forwarded request carries the caller's credentials and headers and
// none of the proxy's: no token, no basic auth, no impersonation, no
// client certificate.
func TestForwardingCarriesOnlyTheCallersCredentials(t *testing.T) {
	type seen struct {
		header    http.Header
		peerCerts int
		proto     string
	}
	var mu sync.Mutex
	var got []seen
	cfg := tlsUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, seen{r.Header.Clone(), len(r.TLS.PeerCertificates), r.Proto})
	}))
	px := newTestProxyTo(t, &enginetest.Engine{}, cfg)
	resp, _ := get(t, px, "agent", "/api/v1/namespaces/ns/configmaps?watch=true",
		"Impersonate-User", "bob", "X-Forwarded-For", "10.0.0.1", "X-Custom", "kept", "Connection", "X-Hop", "X-Hop", "dropped")
	if resp.StatusCode != 200 || len(got) != 1 {
		t.Fatalf("HTTP %d, %d upstream requests", resp.StatusCode, len(got))
	}
	h := got[0].header
	for name, want := range map[string]string{
		"Authorization":    "Bearer agent",
		"Impersonate-User": "bob",
		"X-Custom":         "kept",
		"X-Forwarded-For":  "10.0.0.1, 127.0.0.1",
		"X-Hop":            "",
	} {
		if h.Get(name) != want {
			t.Errorf("upstream got %s %q, want %q", name, h.Get(name), want)
		}
	}
	if got[0].peerCerts != 0 {
		t.Errorf("the proxy presented %d client certificates upstream", got[0].peerCerts)
	}
	if got[0].proto != "HTTP/2.0" {
		t.Errorf("upstream protocol %s, want HTTP/2.0", got[0].proto)
	}
}

// exec, attach and port-forward upgrade the connection, and so can a
// watch (over WebSocket, answered by the admission step and followed to
// its end): the proxy passes the upgrade through over HTTP/1.1, even to
// an upstream that prefers HTTP/2, and then relays bytes both ways.
func TestUpgradesPassThrough(t *testing.T) {
	for name, tc := range map[string]struct {
		request, upgrade string
		wantEnded        int
	}{
		"exec over SPDY":       {"POST /api/v1/namespaces/ns/pods/p/exec?command=sh HTTP/1.1", "SPDY/3.1", 0},
		"watch over WebSocket": {"GET /api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=42 HTTP/1.1", "websocket", 1},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := tlsUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Upgrade") != tc.upgrade || r.Header.Get("Authorization") != "Bearer alice" {
					http.Error(w, "want an authenticated "+tc.upgrade+" upgrade, got "+r.Proto, http.StatusBadRequest)
					return
				}
				conn, rw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				defer conn.Close()
				_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + tc.upgrade + "\r\n\r\n")
				_ = rw.Flush()
				line, _ := rw.ReadString('\n')
				_, _ = rw.WriteString("echo " + line)
				_ = rw.Flush()
			}))
			engine := &enginetest.Engine{}
			px := newTestProxyTo(t, engine, cfg)

			conn, err := net.Dial("tcp", strings.TrimPrefix(px.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(conn, tc.request+"\r\nHost: x\r\nAuthorization: Bearer alice\r\n"+
				"Connection: Upgrade\r\nUpgrade: "+tc.upgrade+"\r\nContent-Length: 0\r\n\r\n")
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols {
				body, _ := io.ReadAll(resp.Body)
				t.Fatalf("HTTP %d %s, want 101", resp.StatusCode, body)
			}
			_, _ = io.WriteString(conn, "hello\n")
			if line, err := br.ReadString('\n'); err != nil || line != "echo hello\n" {
				t.Fatalf("relayed %q, %v; want \"echo hello\\n\"", line, err)
			}
			conn.Close()
			if got := engine.WaitEnded(t, tc.wantEnded); len(got) != tc.wantEnded {
				t.Errorf("the engine heard of %d ended watches, want %d", len(got), tc.wantEnded)
			}
			if requests, _, _ := engine.Snapshot(); len(requests) != tc.wantEnded {
				t.Errorf("the engine decided %d requests, want %d", len(requests), tc.wantEnded)
			}
		})
	}
}
