package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/watchgate/watchgate/ratelimit"
)

// withoutGate is client-go's feature gates with one feature off.
type withoutGate struct {
	clientfeatures.Gates
	off clientfeatures.Feature
}

func (g withoutGate) Enabled(f clientfeatures.Feature) bool {
	return f != g.off && g.Gates.Enabled(f)
}

// A client-go 0.37 informer as it ships (its initial state by a streaming
// watch-list, gzip accepted) and with each default switched off, through
// a stale storm: the informer syncs and sees events, stale watches are
// answered locally, a watch-list that fails inside its gzip stream backs
// its key off, and the informer's first watch costs the initial-state
// tokens exactly when it asks for the initial state.
func TestInformerAsShippedThroughAStaleStorm(t *testing.T) {
	for _, tc := range []struct {
		name               string
		watchList, gzipped bool
	}{
		{"defaults", true, true},
		{"watch-list off", false, true},
		{"compression off", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.watchList {
				orig := clientfeatures.FeatureGates()
				clientfeatures.ReplaceFeatureGates(withoutGate{orig, clientfeatures.WatchListClient})
				t.Cleanup(func() { clientfeatures.ReplaceFeatureGates(orig) })
			}
			ctx := context.Background()
			ns := uniqueName("shipped")
			rules := readWatch("configmaps", "podtemplates")
			sa := serviceAccount(t, ns, "agent", rules)
			other := serviceAccount(t, ns, "other", rules)
			failing := serviceAccount(t, ns, "failing", rules)
			stale := makeStale(t, ns)
			budget := generous("clients", 100)
			budget.Limits = ratelimit.Limits{WatchOpensPerMinute: 1, WatchBurst: 10, InitialStateCost: 10, MaxConcurrentWatches: 1000}
			budget.Backoff = ratelimit.Backoff{Initial: 30 * time.Second, Max: time.Minute, ShortWatch: time.Second, ResetAfter: 2 * time.Minute}
			p := startProxy(t, budget)

			cfg := p.Config(sa.Token, false)
			cfg.DisableCompression = !tc.gzipped
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
			inf := factory.Core().V1().ConfigMaps().Informer()
			got := &seen{data: map[string]string{}}
			if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: got.set, UpdateFunc: func(_, o any) { got.set(o) }}); err != nil {
				t.Fatal(err)
			}
			ictx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Go(func() { factory.Start(ictx.Done()); factory.WaitForCacheSync(ictx.Done()) })
			t.Cleanup(func() { stop(); wg.Wait(); factory.Shutdown() })

			// The storm: tabs looping on the stale version, answered
			// locally after the first.
			path := "/api/v1/namespaces/" + ns + "/podtemplates"
			staleRejected := map[string]string{"verb": "watch", "reason": "StaleResourceVersion", "budget": "clients"}
			rejectedBefore := proxyMetric(t, "watchgate_proxy_requests_total", staleRejected)
			var storm sync.WaitGroup
			for range 10 {
				storm.Go(func() {
					if a := rawWatch(t, p, other.Token, path, url.Values{"watch": {"true"}, "resourceVersion": {stale}}, tc.gzipped, 30*time.Second); a.Code != 410 {
						t.Errorf("a watch from the stale version: %v, want an ERROR 410", a)
					}
				})
			}
			storm.Wait()
			if n := proxyMetric(t, "watchgate_proxy_requests_total", staleRejected) - rejectedBefore; n < 9 {
				t.Errorf("%v stale watches answered locally, want at least 9 of 10", n)
			}

			eventually(t, 30*time.Second, "the informer's initial state", func() (bool, error) {
				return inf.HasSynced() && got.equals(map[string]string{"before": ""}), nil
			})
			if _, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after"}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the informer's watch to deliver an event", func() (bool, error) {
				return got.equals(map[string]string{"before": "", "after": "1"}), nil
			})

			// The initial-state cost: a watch-list took all 10 tokens, a
			// list then a watch from its version took 1.
			probe := rawWatch(t, p, sa.Token, "/api/v1/namespaces/"+ns+"/configmaps",
				url.Values{"watch": {"true"}, "resourceVersion": {currentVersion(t, ns)}, "timeoutSeconds": {"1"}}, tc.gzipped, 10*time.Second)
			if wantLimited := tc.watchList; (probe.HTTPStatus == http.StatusTooManyRequests) != wantLimited {
				t.Errorf("a watch after the informer's: %v; want rate limited = %v (the informer's watch-list costs the initial state)", probe, wantLimited)
			}

			// Backoff: a watch-list from a future version fails inside its
			// (gzip) stream; the key backs off.
			future, _ := strconv.ParseUint(currentVersion(t, ns), 10, 64)
			q := url.Values{"watch": {"true"}, "sendInitialEvents": {"true"}, "resourceVersionMatch": {"NotOlderThan"}, "allowWatchBookmarks": {"true"},
				"resourceVersion": {fmt.Sprint(future + 1_000_000)}}
			cmPath := "/api/v1/namespaces/" + ns + "/configmaps"
			if a := rawWatch(t, p, failing.Token, cmPath, q, tc.gzipped, 30*time.Second); a.FirstType != "ERROR" || (a.Encoding == "gzip") != tc.gzipped {
				t.Fatalf("a watch-list from the future: %v, Content-Encoding %q", a, a.Encoding)
			}
			again := rawWatch(t, p, failing.Token, cmPath, url.Values{"watch": {"true"}, "resourceVersion": {currentVersion(t, ns)}, "timeoutSeconds": {"1"}}, tc.gzipped, 10*time.Second)
			if again.HTTPStatus != http.StatusTooManyRequests {
				t.Errorf("the same key after a failed watch-list: %v, want 429 (backing off)", again)
			}
		})
	}
}
