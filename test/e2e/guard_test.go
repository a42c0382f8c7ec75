package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// The replica's own guard in front of the real API server: at --max-watches
// a new watch gets 429 with Retry-After and open watches go on; above the
// memory high-water mark (memory read through the test seam) a new watch
// or list of the tenant holding the most (a namespace's service accounts
// together) gets 503 with Retry-After while another tenant's list still
// passes; both lift by themselves.
// The real runtime reading against a real GOMEMLIMIT is `make load`.
func TestWatchGuardThroughTheProxy(t *testing.T) {
	ctx := context.Background()
	ns := uniqueName("guard")
	sa := serviceAccount(t, ns, "agent", readWatch("configmaps"))
	engine := ratelimit.NewEngine(ratelimit.Options{Seed: 1})
	policy, err := ratelimit.NewPolicy([]ratelimit.Budget{generous("everyone", 100)})
	if err != nil {
		t.Fatal(err)
	}
	engine.SetPolicy(time.Now(), policy)
	var inUse atomic.Uint64
	inUse.Store(100 << 20)
	_, url, ca, _ := startProxyOn(t, env, engine, func(o *proxy.Options) {
		o.MaxWatches = 2
		o.MaxWatchesPerIdentity = 2 // one caller here; the ceiling has its own tests
		o.MemoryReader = func() (uint64, uint64) { return inUse.Load(), 1 << 30 }
	})
	cfg := env.ConfigFor(sa.Token, url, ca)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.CloseIdleConnections()
	// try opens a watch with a plain client (client-go would wait and
	// retry a 429/503 ten times) and returns its status, Retry-After,
	// decision header and Status reason; an admitted watch is closed.
	try := func(path string) (int, string, string, metav1.StatusReason) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, url+path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s metav1.Status
		if resp.StatusCode != http.StatusOK {
			_ = json.NewDecoder(resp.Body).Decode(&s)
		}
		return resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get(proxy.DecisionHeader), s.Reason
	}
	watchPath := "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=5"

	w1, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w1.Stop()
	w2, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	code, retry, decision, reason := try(watchPath)
	if code != http.StatusTooManyRequests || retry == "" || reason != metav1.StatusReasonTooManyRequests || !strings.Contains(decision, "reason="+proxy.GuardMaxWatches) {
		t.Errorf("a third watch at --max-watches 2: HTTP %d, Retry-After %q, %q, %s; want 429 with Retry-After, reason %s",
			code, retry, decision, reason, proxy.GuardMaxWatches)
	}
	w2.Stop()
	eventually(t, 10*time.Second, "the stopped watch's place to be free", func() (bool, error) {
		code, _, _, _ := try(watchPath)
		return code == http.StatusOK, nil
	})

	inUse.Store(950 << 20) // 93% of 1 GiB, above the default 85%
	eventually(t, 10*time.Second, "the memory guard to refuse", func() (bool, error) {
		code, retry, decision, reason = try(watchPath)
		return code == http.StatusServiceUnavailable, nil
	})
	if retry == "" || reason != metav1.StatusReasonServiceUnavailable || !strings.Contains(decision, "reason="+proxy.GuardMemoryHighWater) {
		t.Errorf("a watch above the memory mark: Retry-After %q, %q, %s; want Retry-After, reason %s", retry, decision, reason, proxy.GuardMemoryHighWater)
	}
	if code, _, decision, _ := try("/api/v1/namespaces/" + ns + "/configmaps"); code != http.StatusServiceUnavailable {
		t.Errorf("a list of the caller holding the most above the memory mark: HTTP %d, %q; want 503", code, decision)
	}
	// Another tenant: a service account of the same namespace would be
	// the same tenant, and refused with it.
	otherNS := uniqueName("guard-other")
	other := serviceAccount(t, otherNS, "other", readWatch("configmaps"))
	ocs, err := kubernetes.NewForConfig(env.ConfigFor(other.Token, url, ca))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ocs.CoreV1().ConfigMaps(otherNS).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("another tenant's list above the memory mark: %v, want it served", err)
	}
	sibling := serviceAccount(t, ns, "sibling", readWatch("configmaps"))
	shc, err := rest.HTTPClientFor(env.ConfigFor(sibling.Token, url, ca))
	if err != nil {
		t.Fatal(err)
	}
	defer shc.CloseIdleConnections()
	sreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/namespaces/"+ns+"/configmaps", nil)
	sresp, err := shc.Do(sreq)
	if err != nil {
		t.Fatal(err)
	}
	_ = sresp.Body.Close()
	if sresp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a list of another service account of the namespace holding the most, above the memory mark: HTTP %d, want 503 (one tenant)", sresp.StatusCode)
	}
	inUse.Store(100 << 20)
	eventually(t, 10*time.Second, "the memory guard to lift", func() (bool, error) {
		code, _, _, _ := try(watchPath)
		return code == http.StatusOK, nil
	})
}
