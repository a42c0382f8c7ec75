package e2e

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// A replica's watch places are shared among callers, through the real
// proxy in front of the real API server: with the per-identity ceiling's
// default (a quarter of --max-watches) one caller cannot take the replica,
// and watches its budget rejects wait out their delay without a place, so
// another caller's first watch gets in.
func TestOneCallerCannotTakeTheReplica(t *testing.T) {
	ctx := context.Background()
	// Three namespaces: a namespace's service accounts share one place.
	ns := uniqueName("fairshare")
	greedy := serviceAccount(t, ns, "greedy", readWatch("configmaps"))
	hoarder := serviceAccount(t, uniqueName("hoarder"), "hoarder", readWatch("configmaps"))
	other := serviceAccount(t, uniqueName("other"), "other", readWatch("configmaps"))
	// The greedy caller's budget lets it hold 2 watches; its further
	// watches wait up to 3s before their 429.
	greedyBudget := generous("greedy-"+ns, 10)
	greedyBudget.Subjects = []ratelimit.Subject{{Kind: ratelimit.ServiceAccount, Namespace: ns, Name: "greedy"}}
	greedyBudget.Limits.MaxConcurrentWatches = 2
	p := startProxyWith(t, func(o *proxy.Options) {
		o.MaxWatches = 8 // so each caller's ceiling is 2 by default
		o.MaxRejectDelay = 3 * time.Second
	}, greedyBudget, generous("everyone-"+ns, 100))
	c := p.clientFrom("127.0.0.1")
	defer c.CloseIdleConnections()

	holdTwo := func(token string) {
		cs, err := kubernetes.NewForConfig(p.Config(token, false))
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Stop)
		}
	}
	holdTwo(greedy.Token)
	path := "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=1"
	var wg sync.WaitGroup
	defer wg.Wait()
	for range 6 {
		wg.Go(func() {
			code, decision, err := send(c, p.URL, greedy.Token, path)
			if err != nil || code != http.StatusTooManyRequests || !strings.Contains(decision, "reason="+string(ratelimit.ReasonTooManyWatches)) {
				t.Errorf("the greedy caller's third watch: HTTP %d %q %v, want 429 TooManyWatches", code, decision, err)
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // they wait out their delay now

	// A caller whose budget refuses nothing stops at its ceiling.
	holdTwo(hoarder.Token)
	code, decision, err := send(c, p.URL, hoarder.Token, path)
	if err != nil || code != http.StatusTooManyRequests || !strings.Contains(decision, "reason="+proxy.GuardMaxWatchesPerIdentity) {
		t.Errorf("the hoarder's third watch: HTTP %d %q %v, want 429 %s", code, decision, err, proxy.GuardMaxWatchesPerIdentity)
	}
	// 4 of 8 places are taken; the greedy caller's waiting watches hold
	// none, so another caller gets in.
	if code, decision, err := send(c, p.URL, other.Token, path); err != nil || code != http.StatusOK {
		t.Errorf("the other caller's watch: HTTP %d %q %v, want 200", code, decision, err)
	}
}

// A caller's burst of watch opens through the real proxy in front of the
// real API server: past its bucket's burst its next watch gets 429
// WatchOpenRate, at once, while another caller's first watch goes
// through.
func TestOneCallersBurstOfWatchOpensIsHeldToItsRate(t *testing.T) {
	ns := uniqueName("openrate")
	burst := serviceAccount(t, ns, "burst", readWatch("configmaps"))
	other := serviceAccount(t, ns, "other", readWatch("configmaps"))
	p := startProxyWith(t, func(o *proxy.Options) {
		// 3 at once, then one every 100 s: nothing refills while it runs.
		o.WatchOpensPerIdentityPerSecond, o.WatchOpenBurstPerIdentity = 0.01, 3
	}, generous("everyone-"+ns, 100))
	c := p.clientFrom("127.0.0.1")
	defer c.CloseIdleConnections()
	path := "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=1"
	for i := range 3 {
		if code, decision, err := send(c, p.URL, burst.Token, path); err != nil || code != http.StatusOK {
			t.Fatalf("watch %d of the burst of 3: HTTP %d %q %v, want 200", i+1, code, decision, err)
		}
	}
	code, decision, err := send(c, p.URL, burst.Token, path)
	if err != nil || code != http.StatusTooManyRequests || !strings.Contains(decision, "reason="+proxy.GuardWatchOpenRate) {
		t.Errorf("the caller's 4th watch: HTTP %d %q %v, want 429 %s", code, decision, err, proxy.GuardWatchOpenRate)
	}
	if code, decision, err := send(c, p.URL, other.Token, path); err != nil || code != http.StatusOK {
		t.Errorf("the other caller's first watch: HTTP %d %q %v, want 200", code, decision, err)
	}
}
