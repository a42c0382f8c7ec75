package e2e

import (
	"context"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// On shutdown, readiness drops first, then the open watches end cleanly
// (client-go sees a normal end of stream, not an error), one after the
// other over the grace period; afterwards no goroutine of the proxy is left,
// whatever the requests did (rejected, abandoned by the client, refused).
func TestShutdownClosesWatchesSpreadAndLeavesNoGoroutine(t *testing.T) {
	ctx := context.Background()
	ns := uniqueName("shutdown")
	sa := serviceAccount(t, ns, "agent", readWatch("configmaps"))
	p := startProxy(t, generous("everyone", 100))
	cs, err := kubernetes.NewForConfig(p.Config(sa.Token, false))
	if err != nil {
		t.Fatal(err)
	}

	// Requests that end in every way: a client that leaves mid-stream, a
	// client that leaves before the answer, no token, an unknown resource.
	w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()
	shortCtx, cancel := context.WithTimeout(ctx, time.Millisecond)
	_, _ = cs.CoreV1().ConfigMaps(ns).Watch(shortCtx, metav1.ListOptions{})
	cancel()
	if resp, _ := rawGet(t, p, "", "/api/v1/namespaces", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: HTTP %d, want 401", resp.StatusCode)
	}
	if resp, _ := rawGet(t, p, sa.Token, "/apis/nope.example.com/v1/things?watch=true", nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("watch of an unknown resource: HTTP %d, want the API server's 403", resp.StatusCode)
	}

	const open = 3
	ends := make(chan time.Time, open)
	var watchers sync.WaitGroup
	for range open {
		w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		watchers.Go(func() {
			for ev := range w.ResultChan() {
				t.Errorf("watch got %v %#v before or during shutdown, want a clean end of stream", ev.Type, ev.Object)
			}
			ends <- time.Now()
		})
	}
	eventually(t, 10*time.Second, "the watches to be open", func() (bool, error) {
		return proxyMetric(t, "watchgate_proxy_active_watches", nil) == open, nil
	})

	if len(proxyGoroutines()) == 0 {
		t.Fatal("the leak check sees no proxy goroutine while watches are open; it would prove nothing")
	}

	stopped := make(chan struct{})
	go func() { p.stop(); close(stopped) }()
	eventually(t, 2*time.Second, "readiness to drop", func() (bool, error) { return p.ReadyCheck(nil) != nil, nil })
	watchers.Wait()
	close(ends)
	var first, last time.Time
	for e := range ends {
		if first.IsZero() || e.Before(first) {
			first = e
		}
		if e.After(last) {
			last = e
		}
	}
	// Grace 1.5s over 3 watches: one every 0.5s, the last 1s after the first.
	if spread := last.Sub(first); spread < 700*time.Millisecond {
		t.Errorf("watches closed within %v of each other, want them spread over the grace period", spread)
	}
	<-stopped

	var left []string
	eventually(t, 10*time.Second, "the proxy's goroutines to end", func() (bool, error) {
		left = proxyGoroutines()
		return len(left) == 0, nil
	})
	if len(left) > 0 {
		t.Errorf("goroutines left:\n%s", strings.Join(left, "\n\n"))
	}
}

// proxyGoroutines returns the stacks of goroutines that run proxy code, were
// started by it, or serve its connections.
func proxyGoroutines() []string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var found []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/watchgate/watchgate/proxy.") || strings.Contains(g, "net/http.(*conn).serve") {
			found = append(found, g)
		}
	}
	return found
}
