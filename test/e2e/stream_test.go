package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

// Issue 9 finding 1: an RBAC denial is not a failing watch. A service
// account without list/watch rights gets the API server's 403 every time,
// through a budget that backs off failing watches, never a 429.
func TestForbiddenWatchesDoNotBackOff(t *testing.T) {
	ns := uniqueName("denied")
	sa := serviceAccount(t, ns, "nobody") // no rules at all
	b := generous("everyone", 100)
	b.Backoff = ratelimit.Backoff{Initial: 30 * time.Second, Max: time.Minute, ShortWatch: time.Minute}
	p := startProxy(t, b)
	ended := map[string]string{"outcome": "denied"}
	deniedBefore := proxyMetric(t, "watchgate_proxy_watches_ended_total", ended)
	for i := range 5 {
		resp, body := rawGet(t, p, sa.Token, "/api/v1/namespaces/"+ns+"/configmaps?watch=true", nil)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("watch %d: HTTP %d %s (%s), want the API server's 403 every time",
				i, resp.StatusCode, resp.Header.Get(proxy.DecisionHeader), body)
		}
		if h := resp.Header.Get(proxy.DecisionHeader); strings.Contains(h, "BackingOff") {
			t.Fatalf("watch %d: decision %q backs off after a 403", i, h)
		}
	}
	eventually(t, 5*time.Second, "the watches to end as denied", func() (bool, error) {
		return proxyMetric(t, "watchgate_proxy_watches_ended_total", ended)-deniedBefore >= 5, nil
	})
}

// Issue 10 item 1: clients of one identity open a watch from one compacted
// version at the same instant; the API server sees one WATCH, and every
// client gets the ERROR 410 it would have got directly. 300 clients are
// more than one caller's followers may wait in line (256): the others wait
// out of line, and none goes upstream.
func TestConcurrentStaleWatchesAskTheAPIServerOnce(t *testing.T) {
	for _, clients := range []int{20, 300} {
		t.Run(fmt.Sprint(clients, " clients"), func(t *testing.T) { concurrentStaleWatches(t, clients) })
	}
}

func concurrentStaleWatches(t *testing.T, clients int) {
	ctx := context.Background()
	ns := uniqueName("storm")
	sa := serviceAccount(t, ns, "dashboard", readWatch("podtemplates"))
	rv := makeStale(t, ns)
	p := startProxy(t, generous("everyone", 100))
	before, err := env.WatchRequests(ctx, "", "podtemplates")
	if err != nil {
		t.Fatal(err)
	}
	cfg := p.Config(sa.Token, false)
	start := make(chan struct{})
	var wg sync.WaitGroup
	codes := make([]int, clients)
	for i := range codes {
		wg.Go(func() {
			<-start
			ans, err := apiserver.WatchFor(ctx, cfg, "/api/v1/namespaces/"+ns+"/podtemplates", rv, 10*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			codes[i] = ans.Code
		})
	}
	close(start)
	wg.Wait()
	if slices.ContainsFunc(codes, func(c int) bool { return c != http.StatusGone }) {
		t.Errorf("codes %v, want 410 for every client", codes)
	}
	var after float64
	eventually(t, 15*time.Second, "the first watch to be counted by the API server", func() (bool, error) {
		after, err = env.WatchRequests(ctx, "", "podtemplates")
		return after >= before+1, err
	})
	time.Sleep(time.Second) // any later watch would be counted by now
	if after, err = env.WatchRequests(ctx, "", "podtemplates"); err != nil || after != before+1 {
		t.Errorf("API server saw %v WATCH requests for the stale version from %d concurrent clients, want 1 (err %v)", after-before, clients, err)
	}
}

// BenchmarkValidVersionWatchOpen measures the open latency (until the
// response headers) of watches from a valid, explicit resourceVersion
// through the proxy, alone and with twins (8 watches from the same version
// at once, which wait for the first one's verdict). Run it alone:
//
//	go test -run '^$' -bench BenchmarkValidVersionWatchOpen -benchtime 100x ./test/e2e/
func BenchmarkValidVersionWatchOpen(b *testing.B) {
	ctx := context.Background()
	ns := uniqueName("valid")
	sa := serviceAccount(b, ns, "bench", readWatch("configmaps"))
	p := startProxy(b, generous("everyone", 100))
	rt, err := rest.TransportFor(p.Config(sa.Token, false))
	if err != nil {
		b.Fatal(err)
	}
	// open returns once the headers came, and keeps the watch open until
	// release is closed, so a first watch's verdict comes from its stream,
	// not from its end.
	open := func(rv string, release <-chan struct{}) (time.Duration, error) {
		cctx, cancel := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(cctx, http.MethodGet,
			p.URL+"/api/v1/namespaces/"+ns+"/configmaps?watch=true&timeoutSeconds=30&resourceVersion="+rv, nil)
		t0 := time.Now()
		resp, err := rt.RoundTrip(req)
		if err != nil {
			cancel()
			return 0, err
		}
		d := time.Since(t0)
		if resp.StatusCode != http.StatusOK {
			cancel()
			_ = resp.Body.Close()
			return d, fmt.Errorf("watch from %s: HTTP %d", rv, resp.StatusCode)
		}
		go func() {
			<-release
			cancel()
			_ = resp.Body.Close()
		}()
		return d, nil
	}
	for _, twins := range []int{1, 8} {
		b.Run(map[int]string{1: "alone", 8: "with7twins"}[twins], func(b *testing.B) {
			var mu sync.Mutex
			var lat []time.Duration
			heldBefore := proxyMetric(b, "watchgate_proxy_watches_coalesced_total", nil)
			for b.Loop() {
				// A fresh valid version each round: a new object's, so that no
				// watch of an earlier round is still asking about it.
				l, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "v-"}}, metav1.CreateOptions{})
				if err != nil {
					b.Fatal(err)
				}
				var wg sync.WaitGroup
				release := make(chan struct{})
				for range twins {
					wg.Go(func() {
						d, err := open(l.ResourceVersion, release)
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						lat = append(lat, d)
						mu.Unlock()
					})
				}
				wg.Wait()
				close(release)
			}
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
				b.ReportMetric((proxyMetric(b, "watchgate_proxy_watches_coalesced_total", nil)-heldBefore)/float64(b.N), "held/op")
			}
		})
	}
}
