package controllers_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
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
	"github.com/watchgate/watchgate/test/apiserver"
)

var (
	env *apiserver.Env
	// admin is an uncached admin client that knows WatchBudgets.
	admin client.Client
)

// TestMain starts a control plane with the CRDs; WATCHGATE_TEST_LOG=1 shows
// the controllers' logs, up to V(5).
func TestMain(m *testing.M) {
	apiserver.Main(m, &env, apiserver.Suite{
		Options: apiserver.Options{CRDDirectoryPaths: []string{filepath.Join(apiserver.RepoRoot(), "config", "crd", "bases")}},
		Setup: func(e *apiserver.Env) error {
			var err error
			admin, err = client.New(e.Config, client.Options{Scheme: newScheme()})
			return err
		},
	})
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// replica is one watchgate replica under test: a manager with the
// controllers, feeding its own engine.
type replica struct {
	engine *ratelimit.Engine
	ctrls  *controllers.Controllers
	// elected is closed when the replica leads (at once without leader
	// election).
	elected <-chan struct{}
	stop    func()
}

type replicaOptions struct {
	controllers.Options
	engine ratelimit.Options
	// events records throttling Events (controllers.NewThrottleEvents).
	events bool
	// leaseNamespace, when set, turns leader election on, with a lease in
	// that namespace.
	leaseNamespace string
}

// startReplica starts a manager (no leader election: every replica runs
// every piece) and stops it at cleanup, or earlier through stop.
func startReplica(t *testing.T, opts replicaOptions) *replica {
	t.Helper()
	if opts.StatusInterval == 0 {
		opts.StatusInterval = 100 * time.Millisecond
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                  newScheme(),
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
		GracefulShutdownTimeout: ptr.To(10 * time.Second),
		LeaderElection:          opts.leaseNamespace != "",
		LeaderElectionNamespace: opts.leaseNamespace,
		LeaderElectionID:        "watchgate-test",
		// Let a leader that stops hand over at once.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if opts.events {
		opts.ThrottleEvents = controllers.NewThrottleEvents(mgr, nil)
		opts.engine.OnThrottled = opts.ThrottleEvents.OnThrottled
	}
	engine := ratelimit.NewEngine(opts.engine)
	c, err := controllers.SetupWithManager(mgr, engine, opts.Options)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager of %s: %v", opts.PodName, err)
		}
	}
	t.Cleanup(stop)
	eventually(t, 30*time.Second, "the first policy is loaded", func() error {
		if !c.Policy.Loaded() {
			return errors.New("not loaded")
		}
		return nil
	})
	return &replica{engine: engine, ctrls: c, elected: mgr.Elected(), stop: stop}
}

// eventually polls cond every 20 ms until it returns nil, and fails the
// test with cond's last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// createBudget creates wb and deletes it at cleanup.
func createBudget(t *testing.T, wb *v1alpha1.WatchBudget) {
	t.Helper()
	ctx := context.Background()
	if err := admin.Create(ctx, wb); err != nil {
		t.Fatalf("create WatchBudget %s: %v", wb.Name, err)
	}
	t.Cleanup(func() { _ = client.IgnoreNotFound(admin.Delete(context.Background(), wb)) })
}

// policyBudget returns the engine's budget by name, or an error.
func policyBudget(e *ratelimit.Engine, name string) (ratelimit.Budget, error) {
	for _, b := range e.Policy().Budgets() {
		if b.Name == name {
			return b, nil
		}
	}
	return ratelimit.Budget{}, fmt.Errorf("budget %s not in the engine's policy", name)
}

func getBudget(t *testing.T, name string) *v1alpha1.WatchBudget {
	t.Helper()
	var wb v1alpha1.WatchBudget
	if err := admin.Get(context.Background(), client.ObjectKey{Name: name}, &wb); err != nil {
		t.Fatal(err)
	}
	return &wb
}
