package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
)

// sharedReplica is one of several watchgate replicas sharing their
// budgets: a proxy with its engine, and its share reporter.
type sharedReplica struct {
	name   string
	engine *ratelimit.Engine
	url    string
	ca     []byte
	rep    *controllers.ShareReporter
	// crash stops the reporter without a goodbye: its Lease stays until
	// it expires, as a replica that died would leave it.
	crash func()
}

// TestBudgetsSharedByThreeReplicas runs three proxies in front of the test
// bed, each reporting its demand through Leases, and a leader allocating
// their shares, at the default pace (every 2 s, 10 s leases). One service
// account holds watches through them under a budget of 30 concurrent
// watches.
func TestBudgetsSharedByThreeReplicas(t *testing.T) {
	ctx := context.Background()
	began := time.Now()
	ns := uniqueName("shares")
	sa := serviceAccount(t, ns, "spread", readWatch("configmaps"))
	// A watch without a resourceVersion starts with this one's ADDED event,
	// so that an admitted watch answers at once.
	if _, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "one"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(env.Config, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	policy, err := ratelimit.NewPolicy([]ratelimit.Budget{{
		Name: "thirty", Precedence: 1,
		Subjects: []ratelimit.Subject{{Kind: ratelimit.ServiceAccount, Namespace: ns, Name: "spread"}},
		Limits:   ratelimit.Limits{MaxConcurrentWatches: 30},
	}})
	if err != nil {
		t.Fatal(err)
	}

	replicas := make([]*sharedReplica, 3)
	for i, name := range []string{"watchgate-0", "watchgate-1", "watchgate-2"} {
		engine := ratelimit.NewEngine(ratelimit.Options{Seed: 1})
		engine.SetPolicy(time.Now(), policy)
		_, url, ca, _ := startProxyOn(t, env, engine, nil)
		r := &sharedReplica{name: name, engine: engine, url: url, ca: ca,
			rep: &controllers.ShareReporter{Client: admin, Reader: admin, Engine: engine, Pod: name, Namespace: ns, Replicas: 3}}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			tick := time.NewTicker(controllers.DefaultShareInterval)
			defer tick.Stop()
			for {
				r.rep.Step(rctx)
				select {
				case <-rctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
		r.crash = sync.OnceFunc(func() { cancel(); <-done })
		t.Cleanup(r.crash)
		replicas[i] = r
	}
	leader := &controllers.ShareAllocator{Client: admin, Reader: admin, Namespace: ns, Pod: "watchgate-0"}
	lctx, stopLeader := context.WithCancel(ctx)
	leaderDone := make(chan error, 1)
	go func() { leaderDone <- leader.Start(lctx) }()
	t.Cleanup(func() {
		stopLeader()
		if err := <-leaderDone; err != nil {
			t.Errorf("the leader's allocator: %v", err)
		}
	})
	waitFor(t, 20*time.Second, "the leader's first allocation of three replicas", func() bool {
		return len(allocated(t, admin, ns).Replicas) == 3
	})

	t.Logf("%v: first allocation", time.Since(began))
	// held are the watches open through each replica.
	var mu sync.Mutex
	held := make([][]*http.Response, 3)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, rs := range held {
			for _, r := range rs {
				r.Body.Close()
			}
		}
	})
	// open asks replica i for n watches of the account, keeps those
	// admitted, and returns how many were.
	open := func(i, n int) int {
		r := replicas[i]
		cfg := env.ConfigFor(sa.Token, r.url, r.ca)
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		// At once, as n clients would: the proxy holds each refusal back
		// (up to a second) before its 429.
		var got atomic.Int32
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/api/v1/namespaces/"+ns+"/configmaps?watch=true&timeoutSeconds=300", nil)
				resp, err := hc.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				if resp.StatusCode != http.StatusOK {
					resp.Body.Close()
					return
				}
				got.Add(1)
				mu.Lock()
				held[i] = append(held[i], resp)
				mu.Unlock()
			})
		}
		wg.Wait()
		return int(got.Load())
	}
	closeAll := func(i int) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range held[i] {
			r.Body.Close()
		}
		held[i] = nil
	}
	openOn := func() (n [3]int) {
		for i := range replicas {
			n[i] = int(replicas[i].engine.Stats()["thirty"].ActiveWatches)
		}
		return n
	}
	totalOpen := func() int { n := openOn(); return n[0] + n[1] + n[2] }

	// 1. Its clients spread round-robin over the three replicas, asking
	// for 90 watches in all, in rounds over 10 s: at most 1.1 × 30.
	for range 5 {
		for i := range replicas {
			open(i, 6)
		}
		time.Sleep(controllers.DefaultShareInterval)
	}
	if got := totalOpen(); got > 33 || got < 27 {
		t.Fatalf("spread over three replicas: %d watches open in all (%v), want 30 ± 10%% (each replica alone would admit 30)", got, openOn())
	}
	t.Logf("%v: spread: %v open, %d in all", time.Since(began), openOn(), totalOpen())

	// 2. It moves to watchgate-0 alone: its whole budget there within a
	// few seconds.
	closeAll(1)
	closeAll(2)
	waitFor(t, 5*time.Second, "the watches on watchgate-1 and -2 to end", func() bool { n := openOn(); return n[1]+n[2] == 0 })
	start := time.Now()
	for openOn()[0] < 30 && time.Since(start) < 20*time.Second {
		open(0, 30-openOn()[0])
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(start)
	if got := openOn()[0]; got != 30 {
		t.Fatalf("on watchgate-0 alone: %d watches after %v, want its whole 30", got, took)
	}
	if took > 10*time.Second {
		t.Errorf("on watchgate-0 alone: the whole budget after %v, want within 10 s", took)
	}
	if extra := open(0, 3); extra != 0 {
		t.Errorf("on watchgate-0 alone: %d watches beyond the whole budget", extra)
	}
	t.Logf("one replica: the whole budget there after %v", took)

	// 3. watchgate-2 dies: within its lease the others share it all.
	closeAll(0)
	waitFor(t, 5*time.Second, "the watches on watchgate-0 to end", func() bool { return openOn()[0] == 0 })
	replicas[2].crash()
	died := time.Now()
	waitFor(t, controllers.DefaultShareLeaseDuration+3*controllers.DefaultShareInterval, "an allocation without watchgate-2", func() bool {
		return len(allocated(t, admin, ns).Replicas) == 2
	})
	gone := time.Since(died)
	// Its clients spread over the two left, as in 1.
	for range 4 {
		open(0, 8)
		open(1, 8)
		time.Sleep(controllers.DefaultShareInterval)
	}
	if got := totalOpen(); got < 27 || got > 33 {
		t.Errorf("after watchgate-2 died: %d of its watches open on watchgate-0 and -1 (%v), want its whole 30 ± 10%%", got, openOn())
	}
	t.Logf("lost replica: out of the allocation after %v; the survivors hold %v", gone, openOn())

	var writes int64
	for _, r := range replicas {
		writes += r.rep.Writes()
	}
	t.Logf("API-server writes: %d by the three reporters, %d by the leader", writes, leader.Writes())
}

// allocated reads the allocation in the shares Lease of ns (empty when
// there is none yet).
func allocated(t *testing.T, c client.Client, ns string) ratelimit.Allocation {
	t.Helper()
	var l coordinationv1.Lease
	var a ratelimit.Allocation
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: controllers.SharesLease}, &l); err != nil {
		return a
	}
	if err := json.Unmarshal([]byte(l.Annotations[controllers.SharesAnnotation]), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// waitFor polls cond every 100 ms until it holds, or fails the test after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
