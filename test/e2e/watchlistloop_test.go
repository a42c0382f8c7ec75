package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"

	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

// startAggregated registers the test bed's aggregated API server for the
// test and unregisters it after.
func startAggregated(t *testing.T) *apiserver.Aggregated {
	t.Helper()
	a, err := env.StartAggregated(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Stop(context.Background(), env); err != nil {
			t.Error(err)
		}
	})
	return a
}

// readAggregated lets a service account list and watch the aggregated
// API server's resources.
var readAggregated = rbacv1.PolicyRule{
	APIGroups: []string{apiserver.AggregatedGroup},
	Resources: []string{apiserver.BrokenResource, apiserver.HealthyResource},
	Verbs:     []string{"get", "list", "watch"},
}

// informerOf runs a dynamic informer of the aggregated resource with cfg
// (client-go's watch-list is on by default) until the test ends; it
// returns the informer's HasSynced.
func informerOf(t *testing.T, cfg *rest.Config, resource string) func() bool {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: apiserver.AggregatedGroup, Version: apiserver.AggregatedVersion, Resource: resource}
	inf := dynamicinformer.NewFilteredDynamicInformer(dyn, gvr, "", 0, nil, nil).Informer()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { inf.RunWithContext(ctx) })
	t.Cleanup(func() { stop(); wg.Wait() })
	return inf.HasSynced
}

// The loop of kubernetes#140890, against kube-apiserver directly: an
// aggregated API server that never sends a watch-list's initial-events-end
// bookmark, and ends the stream, makes a client-go informer open
// watch-list after watch-list at once, and it never syncs.
func TestUnendingWatchListLoopsDirectly(t *testing.T) {
	a := startAggregated(t)
	ns := uniqueName("watchlist-loop")
	sa := serviceAccount(t, ns, "agent", readAggregated)
	synced := informerOf(t, env.ConfigFor(sa.Token, "", nil), apiserver.BrokenResource)

	time.Sleep(3 * time.Second) // the loop runs; what it did is asserted below
	n := a.Requests(apiserver.BrokenResource, apiserver.KindWatchList)
	// Each ends 100 ms after its events and the next follows at once: some
	// 25 in 3 s on an idle machine; twice what watchgate lets through is
	// already a loop.
	if n < 2*ratelimit.IncompleteWatchListLimit {
		t.Errorf("watch-lists reaching the aggregated server in 3s = %d, want >= %d (the reflector retries at once)", n, 2*ratelimit.IncompleteWatchListLimit)
	}
	if synced() {
		t.Error("the informer synced, want it stuck waiting for the initial-events-end bookmark")
	}
	t.Logf("watch-lists in 3s: %d, lists: %d", n, a.Requests(apiserver.BrokenResource, apiserver.KindList))
}

// Through watchgate the same loop is recognised and damped: after
// ratelimit.IncompleteWatchListLimit watch-lists that ended without their
// initial-events-end bookmark, the identity's watch-lists of the resource
// are answered locally (422 on sendInitialEvents, reason
// WatchListIncomplete), and client-go falls back to a LIST and a WATCH,
// which the aggregated server serves: the informer syncs, and the
// watch-lists that reach the aggregated server are bounded. The same
// identity's informer of a resource whose watch-lists complete is
// untouched. The watch-lists are gzip-encoded, as kube-apiserver 1.37
// sends client-go's.
func TestUnendingWatchListIsDampedThroughTheProxy(t *testing.T) {
	a := startAggregated(t)
	ns := uniqueName("watchlist-damped")
	sa := serviceAccount(t, ns, "agent", readAggregated)
	p := startProxy(t, generous("everyone", 100))
	refused := func() float64 {
		return proxyMetric(t, "watchgate_proxy_requests_total", map[string]string{"reason": string(ratelimit.ReasonWatchListIncomplete)})
	}
	refusedBefore := refused()

	healthy := informerOf(t, p.Config(sa.Token, false), apiserver.HealthyResource)
	broken := informerOf(t, p.Config(sa.Token, false), apiserver.BrokenResource)
	eventually(t, 30*time.Second, "both informers synced", func() (bool, error) {
		return healthy() && broken(), fmt.Errorf("synced: %s %v, %s %v; %s: %d watch-lists, %d lists; %s: %d watch-lists; refused %v",
			apiserver.HealthyResource, healthy(), apiserver.BrokenResource, broken(),
			apiserver.BrokenResource, a.Requests(apiserver.BrokenResource, apiserver.KindWatchList), a.Requests(apiserver.BrokenResource, apiserver.KindList),
			apiserver.HealthyResource, a.Requests(apiserver.HealthyResource, apiserver.KindWatchList), refused()-refusedBefore)
	})

	time.Sleep(3 * time.Second) // the loop would run on; it must not
	if n := a.Requests(apiserver.BrokenResource, apiserver.KindWatchList); n > ratelimit.IncompleteWatchListLimit {
		t.Errorf("watch-lists of %s reaching the aggregated server = %d, want at most %d", apiserver.BrokenResource, n, ratelimit.IncompleteWatchListLimit)
	}
	if n := a.Requests(apiserver.BrokenResource, apiserver.KindList); n < 1 {
		t.Errorf("lists of %s = %d, want the reflector's fallback list", apiserver.BrokenResource, n)
	}
	if n := refused() - refusedBefore; n < 1 {
		t.Errorf("watch-lists refused with reason %s = %v, want at least 1", ratelimit.ReasonWatchListIncomplete, n)
	}
	if st, ok := budgetStats(p.Engine, "everyone"); !ok || st.Decisions[ratelimit.ReasonWatchListIncomplete] < 1 {
		t.Errorf("budget status decisions = %v, want %s counted", st.Decisions, ratelimit.ReasonWatchListIncomplete)
	}
	// What any client gets for the refused watch-list: the API server's
	// answer when it serves no watch-lists, with the reason in words.
	path := fmt.Sprintf("/apis/%s/%s/%s?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
		apiserver.AggregatedGroup, apiserver.AggregatedVersion, apiserver.BrokenResource)
	resp, body := rawGet(t, p, sa.Token, path, nil)
	var st metav1.Status
	if err := json.Unmarshal(body, &st); err != nil || resp.StatusCode != http.StatusUnprocessableEntity || st.Reason != metav1.StatusReasonInvalid ||
		!strings.Contains(st.Message, ratelimit.ReasonWatchListIncomplete.Text()) {
		t.Errorf("a refused watch-list got %d %s, want 422 Invalid saying %q", resp.StatusCode, body, ratelimit.ReasonWatchListIncomplete.Text())
	}
	if wl, l := a.Requests(apiserver.HealthyResource, apiserver.KindWatchList), a.Requests(apiserver.HealthyResource, apiserver.KindList); wl != 1 || l != 0 {
		t.Errorf("%s: %d watch-lists and %d lists, want 1 and 0", apiserver.HealthyResource, wl, l)
	}
}
