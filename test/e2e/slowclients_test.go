package e2e

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watchgate/watchgate/proxy"
)

// slowConnections is how many slowloris connections the test holds.
const slowConnections = 1000

// 1,000 connections that send 48 KiB of headers and
// then trickle one byte a second (slowloris) do not kill the proxy: a valid
// client is served meanwhile, each slow connection is closed after
// ReadHeaderTimeout, and their goroutines go away. A header block over
// MaxHeaderBytes (64 KiB by default) gets 431. The heap and RSS deltas
// (the proxy and the 1,000 client connections share this process) are
// logged.
func TestSlowConnectionsDoNotKillTheProxy(t *testing.T) {
	ns := uniqueName("slow")
	sa := serviceAccount(t, ns, "reader", readWatch("pods"))
	p := startProxyWith(t, func(o *proxy.Options) { o.ReadHeaderTimeout = 15 * time.Second }, generous("everyone", 100))
	c := p.clientFrom("127.0.0.1")
	path := "/api/v1/namespaces/" + ns + "/pods"
	if code, _, err := send(c, p.URL, sa.Token, path); err != nil || code != http.StatusOK {
		t.Fatalf("before: HTTP %d %v", code, err)
	}
	// A header block over the default limit (net/http allows 4 KiB more): 431.
	h1 := p.clientFrom("127.0.0.1")
	h1.Transport.(*http.Transport).ForceAttemptHTTP2 = false
	h1.Transport.(*http.Transport).TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	if code, _, err := send(h1, p.URL, sa.Token, path, "X-Pad", strings.Repeat("x", proxy.DefaultMaxHeaderBytes+8<<10)); err != nil || code != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("a 72 KiB header: HTTP %d %v, want 431", code, err)
	}

	heap0, rss0, g0 := memory()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.CA)
	addr := strings.TrimPrefix(p.URL, "https://")
	pad := strings.Repeat("p", 1000)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mu sync.Mutex
	closedByProxy, opened := 0, 0
	for i := range slowConnections {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatalf("slow connection %d: %v", i, err)
		}
		opened++
		w := bufio.NewWriter(conn)
		fmt.Fprintf(w, "GET %s HTTP/1.1\r\nHost: %s\r\n", path, addr)
		for j := range 48 {
			fmt.Fprintf(w, "X-Pad-%d: %s\r\n", j, pad)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer conn.Close()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := conn.Write([]byte{'a' + byte(k%26)}); err != nil {
					mu.Lock()
					closedByProxy++
					mu.Unlock()
					return
				}
			}
		})
	}
	heap1, rss1, g1 := memory()
	t.Logf("%d slow connections open: heap in use %+.1f MiB, RSS %+.1f MiB, goroutines %+d (proxy and clients in one process)",
		opened, float64(heap1-heap0)/(1<<20), float64(rss1-rss0)/(1<<20), g1-g0)

	// A valid client is served while they hang on.
	if code, _, err := send(p.clientFrom("127.0.0.1"), p.URL, sa.Token, path); err != nil || code != http.StatusOK {
		t.Fatalf("during the slow connections: HTTP %d %v, want 200", code, err)
	}
	if err := p.ReadyCheck(nil); err != nil {
		t.Fatalf("not ready during the slow connections: %v", err)
	}
	// The proxy closes every one of them (ReadHeaderTimeout, 15 s here).
	eventually(t, 60*time.Second, "the proxy closing every slow connection", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return closedByProxy == slowConnections, fmt.Errorf("%d of %d closed", closedByProxy, slowConnections)
	})
	close(stop)
	wg.Wait()
	eventually(t, 30*time.Second, "goroutines back to before", func() (bool, error) {
		_, _, g := memory()
		return g <= g0+20, fmt.Errorf("%d goroutines, %d before", g, g0)
	})
	if code, _, err := send(p.clientFrom("127.0.0.1"), p.URL, sa.Token, path); err != nil || code != http.StatusOK {
		t.Fatalf("after: HTTP %d %v, want 200", code, err)
	}
}

// memory returns the heap in use, the process's RSS (bytes) and the
// number of goroutines, after a GC.
func memory() (heap, rss int64, goroutines int) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				rss = kb << 10
			}
		}
	}
	return int64(m.HeapInuse), rss, runtime.NumGoroutine()
}
