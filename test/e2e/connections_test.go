package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/watchgate/watchgate/proxy"
)

// Connections on which no request authenticated are shed first, and the
// share per network applies only near the cap. At --max-connections 40
// (a share of 10 per /24): a valid client of the /24 of a neighbour
// holding 10 idle connections after a credential-less request each is
// served, with 28 places free; once idle connections of four /24s fill
// the cap, a fifth network's valid client is served at once, in the place
// of an idle one, and a valid client's connection is never shed.
func TestUnauthenticatedConnectionsAreShedFirst(t *testing.T) {
	ns := uniqueName("conns")
	sa := serviceAccount(t, ns, "agent", readWatch("configmaps"))
	p := startProxyWith(t, func(o *proxy.Options) { o.MaxConnections = 40 }, generous("everyone", 10))
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	idle := func(ip string) {
		t.Helper()
		c := p.clientFrom(ip)
		t.Cleanup(c.CloseIdleConnections)
		if code, _, err := send(c, p.URL, "", path); err != nil || code != http.StatusUnauthorized {
			t.Fatalf("a credential-less request from %s: HTTP %d %v, want 401", ip, code, err)
		}
	}
	valid := func(ip string) *http.Client {
		t.Helper()
		c := p.clientFrom(ip)
		c.Timeout = 5 * time.Second
		t.Cleanup(c.CloseIdleConnections)
		if code, _, err := send(c, p.URL, sa.Token, path); err != nil || code != http.StatusOK {
			t.Errorf("a valid client from %s: HTTP %d %v, want 200", ip, code, err)
		}
		return c
	}

	first := valid("127.0.2.100")
	for i := range 10 {
		idle(fmt.Sprintf("127.0.2.%d", 10+i))
	}
	valid("127.0.2.101")

	for n := 3; n <= 5; n++ {
		for i := range 10 {
			idle(fmt.Sprintf("127.0.%d.%d", n, 10+i))
		}
	}
	shed := proxyMetric(t, "watchgate_proxy_connections_shed_total", map[string]string{"reason": "cap"})
	valid("127.0.7.1")
	if n := proxyMetric(t, "watchgate_proxy_connections_shed_total", map[string]string{"reason": "cap"}) - shed; n < 1 {
		t.Errorf("%v connections shed at the cap for the fifth network's client, want at least 1", n)
	}
	// The first valid client's connection, the oldest of the network
	// holding the most, was never shed: it authenticated.
	reused := false
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
	}), http.MethodGet, p.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+sa.Token)
	resp, err := first.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !reused {
		t.Errorf("the first valid client again: HTTP %d, connection reused %v; want 200 on its connection", resp.StatusCode, reused)
	}
}
