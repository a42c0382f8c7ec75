package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

// verifyNoLeaks fails the test when goroutines started during it are still
// running once everything it set up has been stopped. Call it first: its
// cleanup then runs last. Goroutines of client-go's shared transports to
// other control planes and of envtest's process supervision are not the
// proxy's.
func verifyNoLeaks(t *testing.T) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		if err := goleak.Find(before,
			goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
			goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/watch.(*Broadcaster).loop"),
			goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*Typed[...]).updateUnfinishedWorkLoop"),
			goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*delayingType[...]).waitingLoop"),
			goleak.IgnoreAnyFunction("internal/poll.runtime_pollWait"), // idle client connections of other tests' clients
		); err != nil {
			t.Errorf("goroutines left behind: %v", err)
		}
	})
}

// budgetStats returns the engine's figures for budget, and whether the
// current policy has it.
func budgetStats(engine *ratelimit.Engine, budget string) (ratelimit.BudgetStats, bool) {
	s, ok := engine.Stats()[budget]
	return s, ok
}

// The API server stops while an informer watches through the proxy: the
// watch ends and its slot is released, requests get 503 with Retry-After
// (not a hang, not a bare 502), readiness drops; once the API server is back
// readiness returns by itself and the informer reconnects through the proxy
// and sees new objects. Afterwards no goroutine is left.
func TestFaultAPIServerRestartMidWatch(t *testing.T) {
	verifyNoLeaks(t)
	e, err := apiserver.Start(apiserver.Options{Restartable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	ctx := context.Background()
	sa, engine, srv, url, ca, stopProxy := agentOn(t, e, "restart")
	ns := sa.Namespace

	cfg := e.ConfigFor(sa.Token, url, ca)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	opensBefore := proxyMetric(t, "watchgate_proxy_upstream_watch_opens_total", nil)
	activeBefore := proxyMetric(t, "watchgate_proxy_active_watches", nil)
	names := make(chan string, 100)
	inf := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "configmaps", ns, fields.Everything()),
		&corev1.ConfigMap{}, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) { names <- obj.(*corev1.ConfigMap).Name }}); err != nil {
		t.Fatal(err)
	}
	infCtx, stopInformer := context.WithCancel(ctx)
	informerDone := make(chan struct{})
	go func() { inf.RunWithContext(infCtx); close(informerDone) }()
	defer func() { stopInformer(); <-informerDone }()

	create := func(name string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if _, err := e.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	seen := func(name string, timeout time.Duration) {
		t.Helper()
		deadline := time.After(timeout)
		for {
			select {
			case n := <-names:
				if n == name {
					return
				}
			case <-deadline:
				t.Fatalf("the informer did not see %s within %v", name, timeout)
			}
		}
	}
	active := func() int64 { s, _ := budgetStats(engine, "everyone"); return s.ActiveWatches }

	create("before")
	seen("before", 30*time.Second)
	eventually(t, 30*time.Second, "the informer's watch to be open", func() (bool, error) { return active() == 1, nil })

	if err := e.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the watch's slot to be released", func() (bool, error) {
		return active() == 0 && proxyMetric(t, "watchgate_proxy_active_watches", nil) == activeBefore, nil
	})
	eventually(t, 10*time.Second, "readiness to drop", func() (bool, error) { return srv.ReadyCheck(nil) != nil, nil })

	// A watch through the proxy now: 503, Retry-After, a Status body.
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reqCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, url+"/api/v1/namespaces/"+ns+"/configmaps?watch=true", nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("watch while the API server is down: %v (want a 503 answer, not a hang)", err)
	}
	var status metav1.Status
	decodeErr := json.NewDecoder(resp.Body).Decode(&status)
	resp.Body.Close()
	hc.CloseIdleConnections()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || decodeErr != nil ||
		status.Reason != metav1.StatusReasonServiceUnavailable {
		t.Errorf("watch while the API server is down: HTTP %d, Retry-After %q, Status %+v (%v); want 503 ServiceUnavailable with Retry-After",
			resp.StatusCode, resp.Header.Get("Retry-After"), status, decodeErr)
	}

	if err := e.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "readiness to return by itself", func() (bool, error) { return srv.ReadyCheck(nil) == nil, srv.ReadyCheck(nil) })
	create("after")
	seen("after", 90*time.Second) // the reflector may be in its backoff (≤ 30 s)
	eventually(t, 30*time.Second, "the informer's new watch to be open", func() (bool, error) { return active() == 1, nil })
	if opens := proxyMetric(t, "watchgate_proxy_upstream_watch_opens_total", nil) - opensBefore; opens < 2 {
		t.Errorf("%v watches opened through the proxy, want the first and the reconnect", opens)
	}

	stopInformer()
	<-informerDone
	eventually(t, 30*time.Second, "the slot to be released after the informer stopped", func() (bool, error) {
		return active() == 0 && proxyMetric(t, "watchgate_proxy_active_watches", nil) == activeBefore, nil
	})
	if s, _ := budgetStats(engine, "everyone"); s.ActiveWatches < 0 {
		t.Errorf("active watches %d: negative", s.ActiveWatches)
	}
	stopProxy()
}

// WatchBudgets are deleted, recreated, and finally their CRD is removed
// while watches are open through the proxy: the open watches keep flowing,
// the engine releases them without negative counts, new watches are
// admitted under the new policy (none), the watches still open count
// again under the budget once it is back, the manager keeps running and
// picks the budgets up again once the CRD is back.
func TestFaultBudgetsAndCRDRemovedWithWatchesOpen(t *testing.T) {
	ctx := context.Background()
	crdOpts := envtest.CRDInstallOptions{Paths: []string{filepath.Join(apiserver.RepoRoot(), "config", "crd", "bases")}, ErrorIfPathMissing: true}
	install := func() {
		t.Helper()
		if _, err := envtest.InstallCRDs(env.Config, crdOpts); err != nil {
			t.Fatal(err)
		}
	}
	install()
	t.Cleanup(func() { _ = envtest.UninstallCRDs(env.Config, crdOpts) })

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	engine := ratelimit.NewEngine(ratelimit.Options{Seed: 1})
	if _, err := controllers.SetupWithManager(mgr, engine, controllers.Options{PodName: uniqueName("faults")}); err != nil {
		t.Fatal(err)
	}
	mgrCtx, stopMgr := context.WithCancel(ctx)
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()
	t.Cleanup(func() {
		stopMgr()
		if err := <-mgrDone; err != nil {
			t.Errorf("manager stopped with: %v", err)
		}
	})
	_, url, ca, _ := startProxyOn(t, env, engine, nil)

	ns := uniqueName("budgetgone")
	sa := serviceAccount(t, ns, "agent", readWatch("configmaps"))
	cs, err := kubernetes.NewForConfig(env.ConfigFor(sa.Token, url, ca))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName("faults")
	budget := func() *v1alpha1.WatchBudget {
		return &v1alpha1.WatchBudget{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.WatchBudgetSpec{
				Precedence:  10,
				Subjects:    []v1alpha1.Subject{{Kind: "User", Name: sa.Username()}},
				Enforcement: "Enforce",
				Limits:      v1alpha1.Limits{MaxConcurrentWatches: ptr.To[int32](3)},
			},
		}
	}
	inPolicy := func() bool {
		return slices.ContainsFunc(engine.Policy().Budgets(), func(b ratelimit.Budget) bool { return b.Name == name })
	}
	running := func() {
		t.Helper()
		select {
		case err := <-mgrDone:
			t.Fatalf("the manager stopped: %v", err)
		default:
		}
	}
	openWatch := func() watch.Interface {
		t.Helper()
		w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("open watch: %v", err)
		}
		t.Cleanup(w.Stop)
		return w
	}
	// flows checks that every watch in ws sees the config map created now.
	flows := func(ws ...watch.Interface) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: uniqueName("cm")}}
		if _, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for i, w := range ws {
			timeout := time.After(30 * time.Second)
			for seen := false; !seen; {
				select {
				case ev, ok := <-w.ResultChan():
					if !ok {
						t.Fatalf("watch %d ended instead of delivering %s", i, cm.Name)
					}
					if ev.Type == watch.Error {
						t.Fatalf("watch %d got an error: %#v", i, ev.Object)
					}
					if m, ok := ev.Object.(*corev1.ConfigMap); ok && m.Name == cm.Name {
						seen = true
					}
				case <-timeout:
					t.Fatalf("watch %d did not deliver %s within 30s", i, cm.Name)
				}
			}
		}
	}
	active := func() int64 { s, _ := budgetStats(engine, name); return s.ActiveWatches }

	if err := c.Create(ctx, budget()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the budget to be in the policy", func() (bool, error) { return inPolicy(), nil })
	old := []watch.Interface{openWatch(), openWatch()}
	if n := active(); n != 2 {
		t.Fatalf("%d active watches under the budget, want 2", n)
	}

	// 1. The budget is deleted: open watches flow on, new ones are not capped.
	if err := c.Delete(ctx, budget()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the budget to leave the policy", func() (bool, error) { return !inPolicy(), nil })
	flows(old...)
	uncapped := []watch.Interface{openWatch(), openWatch(), openWatch(), openWatch()} // 6 open, the old cap was 3
	flows(uncapped...)
	for _, w := range uncapped {
		w.Stop()
	}

	// 2. The budget comes back: the watches admitted under the old one,
	// still open, count again (an open watch counts against the budget
	// that governs it now), and free their place when they end. The
	// uncapped ones, opened while no budget governed them, were never
	// tracked.
	if err := c.Create(ctx, budget()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the recreated budget to be in the policy", func() (bool, error) { return inPolicy(), nil })
	fresh := openWatch()
	if n := active(); n != 3 {
		t.Errorf("%d active watches under the recreated budget, want 3 (the 2 still open from before and the fresh one)", n)
	}
	for _, w := range old {
		w.Stop()
	}
	eventually(t, 30*time.Second, "the old watches' end to free their places", func() (bool, error) { return active() == 1, nil })

	// 3. The CRD goes, budgets with it: the open watch flows on, the
	// policy empties, the manager keeps running.
	if err := envtest.UninstallCRDs(env.Config, crdOpts); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the CRD to be gone", func() (bool, error) {
		_, err := env.Clientset.Discovery().ServerResourcesForGroupVersion(v1alpha1.GroupVersion.String())
		return apierrors.IsNotFound(err), err
	})
	eventually(t, 30*time.Second, "the budget to leave the policy with its CRD", func() (bool, error) { return !inPolicy(), nil })
	flows(fresh)
	flows(openWatch(), openWatch(), openWatch(), openWatch())
	time.Sleep(3 * time.Second) // the controller's informer now fails to list; give a crash the time to happen
	running()

	// 4. The CRD returns: the running controllers pick the budget up again.
	install()
	if err := c.Create(ctx, budget()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "the budget to be in the policy again (the informer's backoff is ≤ 30 s)", func() (bool, error) { return inPolicy(), nil })
	running()
	w := openWatch()
	flows(w)
	// The fresh watch, admitted under the budget before its CRD went and
	// still open, counts again beside the new one; those opened while no
	// budget existed were never tracked.
	if n := active(); n != 2 {
		t.Errorf("%d active watches under the budget after the CRD came back, want 2 (fresh, still open, and the new one)", n)
	}
}
