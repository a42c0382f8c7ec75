package packaging

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
)

// previousChart is the commit of the last chart release before the
// budgets moved out of the chart (0.1.0, which created them in a
// post-install/post-upgrade hook). The test extracts that chart from the
// repository's own history with `git archive` rather than keeping a copy
// in testdata: the copy could drift from what was released, and the
// history cannot.
const previousChart = "0a9f7a2d828e6bfed41f7114d5c09405418aedf1"

// TestUpgradeFromTheHookChartLosesNothing installs chart 0.1.0, whose hook
// creates the budgets, while a replica (the current code, as the old pods
// would be during a rolling update) holds watches under them and writes
// their status; an operator has edited one default budget and created one
// of their own. `helm upgrade` to this chart deletes and re-creates
// nothing: every budget keeps its UID, spec and status. The new leader,
// started from the upgraded release's --bootstrap-budgets, brings the
// unedited default budgets up to the new values in place, marks the
// edited one as taken over and leaves it and the operator's own alone,
// and the old replica still counts its open watches.
func TestUpgradeFromTheHookChartLosesNothing(t *testing.T) {
	installPrerequisites(t)
	ctx := t.Context()
	const release, ns = "upg", "upgrade-from-hooks"
	def, agents, exempt, own := release+"-watchgate-default", release+"-watchgate-agents", release+"-watchgate-exempt", "upg-own"

	old := filepath.Join(t.TempDir(), "chart-0.1.0")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("git -C %q archive %s charts/watchgate | tar -x -C %q", root, previousChart, old))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("extract chart 0.1.0 from commit %s (the test needs the repository's history): %v\n%s", previousChart, err, out)
	}
	oldChart := filepath.Join(old, "charts", "watchgate")
	// The CRD is the test bed's (another release's): this one installs none.
	if _, err := helm(t, "install", release, oldChart, "--namespace", ns, "--create-namespace", "--set", "crds.enabled=false", "--timeout=2m"); err != nil {
		t.Fatalf("install chart 0.1.0: %v", err)
	}
	t.Cleanup(func() {
		_, _ = helm(t, "uninstall", release, "--namespace", ns)
		for _, n := range []string{def, agents, exempt, own} {
			_, _ = kubectl(t, "", "delete", "wb", n, "--ignore-not-found")
		}
	})

	c, err := client.New(env.Config, client.Options{Scheme: upgradeScheme()})
	if err != nil {
		t.Fatal(err)
	}
	get := func(name string) *v1alpha1.WatchBudget {
		t.Helper()
		var wb v1alpha1.WatchBudget
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &wb); err != nil {
			t.Fatalf("WatchBudget %s: %v", name, err)
		}
		return &wb
	}
	// The operator's edit of a hook budget, and a budget of their own.
	agentsWB := get(agents)
	patch := client.MergeFrom(agentsWB.DeepCopy())
	agentsWB.Spec.Enforcement = v1alpha1.EnforcementEnforce
	agentsWB.Spec.Limits.WatchBurst = ptr.To[int32](700)
	if err := c.Patch(ctx, agentsWB, patch); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: own},
		Spec: v1alpha1.WatchBudgetSpec{Precedence: 10, Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "upg-capped"}},
			Limits: v1alpha1.Limits{MaxConcurrentWatches: ptr.To[int32](3)}},
	}); err != nil {
		t.Fatal(err)
	}

	// An old replica holds watches: 3 of a capped user, 2 under the
	// catch-all; it writes them in its status entries.
	oldReplica := startUpgradeReplica(t, controllers.Options{PodName: "upg-old-0", StatusInterval: 100 * time.Millisecond})
	waitFor(t, 30*time.Second, "the old replica enforces the hook's budgets", func() error {
		for _, n := range []string{def, own} {
			if _, ok := oldReplica.Stats()[n]; !ok {
				return fmt.Errorf("%s not in the policy", n)
			}
		}
		return nil
	})
	watch := func(user string) ratelimit.Decision {
		return oldReplica.Decide(time.Now(), &ratelimit.Request{User: user, Verb: ratelimit.VerbWatch, Resource: "pods", Namespace: ns, ResourceVersion: "1"})
	}
	for i := range 3 {
		if d := watch("upg-capped"); !d.Allowed || d.Budget != own {
			t.Fatalf("capped watch %d: %+v", i, d)
		}
	}
	for range 2 {
		if d := watch("upg-someone"); !d.Allowed || d.Budget != def {
			t.Fatalf("catch-all watch: %+v", d)
		}
	}
	entryActive := func(name, pod string) int64 {
		for _, r := range get(name).Status.Replicas {
			if r.Pod == pod {
				return r.ActiveWatches
			}
		}
		return -1
	}
	waitFor(t, 30*time.Second, "the old replica's entries", func() error {
		if a, b := entryActive(own, "upg-old-0"), entryActive(def, "upg-old-0"); a != 3 || b != 2 {
			return fmt.Errorf("activeWatches %d and %d, want 3 and 2", a, b)
		}
		return nil
	})
	before := map[string]*v1alpha1.WatchBudget{}
	for _, n := range []string{def, agents, exempt, own} {
		before[n] = get(n)
	}

	// helm upgrade to this chart: no hook, no budget in the release.
	if _, err := helm(t, "upgrade", release, chart, "--namespace", ns, "--reuse-values", "--timeout=2m"); err != nil {
		t.Fatalf("upgrade to this chart: %v", err)
	}
	for n, b := range before {
		after := get(n)
		if after.UID != b.UID || after.Generation != b.Generation {
			t.Errorf("%s after helm upgrade: uid %s gen %d, was %s gen %d: re-created or edited by Helm", n, after.UID, after.Generation, b.UID, b.Generation)
		}
	}
	if a := entryActive(def, "upg-old-0"); a != 2 {
		t.Errorf("after helm upgrade, the old replica's entry on %s says %d active watches, want 2", def, a)
	}

	// The new leader, from the upgraded release's flags.
	manifest, err := helm(t, "get", "manifest", release, "--namespace", ns)
	if err != nil {
		t.Fatal(err)
	}
	var boot []controllers.BootstrapBudget
	for _, a := range stringSlice(container(t, find(t, decode(t, manifest), "Deployment", release+"-watchgate")), "args") {
		if v, ok := strings.CutPrefix(a, "--bootstrap-budgets="); ok {
			if boot, err = controllers.ParseBootstrapBudgets(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(boot) != 3 {
		t.Fatalf("the upgraded release bootstraps %d budgets, want 3", len(boot))
	}
	startUpgradeReplica(t, controllers.Options{PodName: "upg-new-0", Namespace: ns, Bootstrap: boot, StatusInterval: 100 * time.Millisecond})
	waitFor(t, 30*time.Second, "the new leader adopts the hook's budgets", func() error {
		d, a, e := get(def), get(agents), get(exempt)
		switch {
		case d.Annotations[controllers.AutoUpdateAnnotation] != "true" || d.Labels[controllers.BootstrapLabel] != ns:
			return fmt.Errorf("%s: annotations %v labels %v", def, d.Annotations, d.Labels)
		case a.Annotations[controllers.AutoUpdateAnnotation] != "false":
			return fmt.Errorf("%s not marked taken over: %v", agents, a.Annotations)
		case len(e.Spec.Subjects) < 2:
			return fmt.Errorf("%s subjects %v, want watchgate's own and the control plane's too", exempt, e.Spec.Subjects)
		}
		return nil
	})
	for n, b := range before {
		if after := get(n); after.UID != b.UID {
			t.Errorf("%s was re-created by the new leader", n)
		}
	}
	if a := get(agents); a.Spec.Enforcement != v1alpha1.EnforcementEnforce || ptr.Deref(a.Spec.Limits.WatchBurst, 0) != 700 {
		t.Errorf("the edited %s lost the operator's spec: %s, burst %d", agents, a.Spec.Enforcement, ptr.Deref(a.Spec.Limits.WatchBurst, 0))
	}
	if o := get(own); o.Generation != before[own].Generation || len(o.Annotations) != 0 {
		t.Errorf("the operator's own budget was touched: gen %d, annotations %v", o.Generation, o.Annotations)
	}
	if s := get(def).Spec.Suggestion.Share; s == nil || *s != 95 {
		t.Errorf("%s suggestion share %v, want the new chart's 95", def, s)
	}

	// Counts: the old replica still holds its watches, under budgets that
	// were edited, never re-created; the 4th capped watch is refused.
	if d := watch("upg-capped"); d.Allowed || d.Reason != ratelimit.ReasonTooManyWatches {
		t.Errorf("a 4th capped watch after the upgrade: %+v, want TooManyWatches", d)
	}
	st := oldReplica.Stats()
	if st[own].ActiveWatches != 3 || st[def].ActiveWatches != 2 {
		t.Errorf("the old replica counts %d and %d open watches, want 3 and 2", st[own].ActiveWatches, st[def].ActiveWatches)
	}
	waitFor(t, 30*time.Second, "both replicas' entries on the catch-all", func() error {
		if a, b := entryActive(def, "upg-old-0"), entryActive(def, "upg-new-0"); a != 2 || b != 0 {
			return fmt.Errorf("old %d, new %d, want 2 and 0", a, b)
		}
		return nil
	})
}

func upgradeScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}

// startUpgradeReplica runs the controllers in this process, as a replica
// does (no leader election: it leads at once), until the test ends, and
// returns its engine.
func startUpgradeReplica(t *testing.T, opts controllers.Options) *ratelimit.Engine {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 upgradeScheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	engine := ratelimit.NewEngine(ratelimit.Options{})
	if _, err := controllers.SetupWithManager(mgr, engine, opts); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica %s: %v", opts.PodName, err)
		}
	})
	return engine
}

// waitFor polls cond every 50 ms until it returns nil, and fails the test
// with its last error after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	err := errors.New("not tried")
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s: %v", what, timeout, err)
}
