package e2e

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// hangingListener accepts connections and never answers; they are closed
// when the test ends.
func hangingListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return "https://" + ln.Addr().String()
}

// Issue 9, faults: the proxy's TokenReviews (and key fetches) go to an
// endpoint that hangs or fails, while forwarded traffic still goes to the
// real API server. Fail closed (the default): 503 Status with Retry-After,
// nothing forwarded. Fail open: forwarded, the API server authenticates the
// caller itself, and the request is charged to system:watchgate:unreviewed,
// never to the caller's or an impersonated identity.
func TestTokenReviewUnavailable(t *testing.T) {
	ns := uniqueName("faults")
	sa := serviceAccount(t, ns, "reader", readWatch("pods"))
	path := "/api/v1/namespaces/" + ns + "/pods"
	failing := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	t.Cleanup(failing.Close)
	unreviewed := generous("unreviewed", 10)
	unreviewed.Subjects = []ratelimit.Subject{{Kind: ratelimit.Group, Name: "system:watchgate:unreviewed"}}

	for name, reviewsAt := range map[string]string{"hanging": hangingListener(t), "failing": failing.URL} {
		for _, policy := range []proxy.ReviewFailurePolicy{proxy.FailClosed, proxy.FailOpen} {
			t.Run(name+"/"+string(policy), func(t *testing.T) {
				p := startProxyWith(t, func(o *proxy.Options) {
					o.Reviews = &rest.Config{Host: reviewsAt, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
					o.ReviewTimeout = 2 * time.Second
					o.ReviewFailurePolicy = policy
				}, unreviewed, generous("everyone", 100))
				c := p.clientFrom("127.0.0.1")
				req, _ := http.NewRequest(http.MethodGet, p.URL+path, nil)
				req.Header.Set("Authorization", "Bearer "+sa.Token)
				req.Header.Set("Impersonate-User", "someone-else")
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				decision := resp.Header.Get(proxy.DecisionHeader)
				switch policy {
				case proxy.FailClosed:
					var s metav1.Status
					if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
						json.Unmarshal(body, &s) != nil || s.Reason != metav1.StatusReasonServiceUnavailable {
						t.Fatalf("HTTP %d Retry-After %q %s; want a 503 ServiceUnavailable Status with Retry-After",
							resp.StatusCode, resp.Header.Get("Retry-After"), body)
					}
				case proxy.FailOpen:
					// Forwarded: the real API server refuses the
					// impersonation the reader may not use (403), and the
					// budget charged is the unreviewed one.
					if resp.StatusCode != http.StatusForbidden || decision != "allow; budget=unreviewed" {
						t.Fatalf("HTTP %d %q %s; want the API server's 403, charged to budget unreviewed", resp.StatusCode, decision, body)
					}
					code, decision, err := send(c, p.URL, sa.Token, path)
					if err != nil || code != http.StatusOK || decision != "allow; budget=unreviewed" {
						t.Fatalf("without impersonation: HTTP %d %q %v; want 200 charged to unreviewed", code, decision, err)
					}
					code, _, err = send(c, p.URL, "not-a-token", path)
					if err != nil || code != http.StatusUnauthorized {
						t.Fatalf("a bad token: HTTP %d %v; want the API server's 401", code, err)
					}
				}
			})
		}
	}
}
