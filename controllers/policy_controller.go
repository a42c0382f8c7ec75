package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/watchgate/watchgate/api/v1alpha1"
)

// +kubebuilder:rbac:groups=watchgate.io,resources=watchbudgets,verbs=get;list;watch

// PolicyReconciler compiles every WatchBudget into one ratelimit.Policy and
// swaps it into the engine. Every replica runs it (it does not need leader
// election): each proxy replica has its own engine and must enforce the
// current budgets whether or not it leads.
//
// Every event maps to one queue key, so a burst of edits compiles once; only
// spec changes (a new generation), creations and deletions count, not the
// status writes replicas make every few seconds. The swap is atomic and
// keeps every identity's state (ratelimit.Engine.SetPolicy): editing one
// budget neither drops watches nor refills anyone's bucket.
//
// It writes nothing to the API server; the Ready condition is the
// ReadyReconciler's job.
type PolicyReconciler struct {
	// Reader lists WatchBudgets, normally the manager's cache.
	Reader client.Reader
	// Engine receives the compiled policy.
	Engine Engine
	// Clock gives the instant of each policy swap; SetupWithManager sets it
	// (a fake one in tests).
	Clock clock.PassiveClock

	loaded atomic.Pointer[Compiled]
}

// policyKey is the only key in the reconciler's queue: every event means
// "compile everything again".
var policyKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "watchbudgets"}}

// SetupWithManager registers the reconciler, and queues a first compile as
// soon as the cache has synced, so that the policy (and readiness) does not
// wait for a WatchBudget event that may never come.
func (r *PolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	toKey := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{policyKey}
	})
	first := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(policyKey)
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("watchbudget-policy").
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false), MaxConcurrentReconciles: 1}).
		WatchesRawSource(source.Kind(mgr.GetCache(), client.Object(&v1alpha1.WatchBudget{}), toKey, predicate.GenerationChangedPredicate{})).
		WatchesRawSource(first).
		Complete(r)
}

// Reconcile compiles every WatchBudget in the cache and swaps the policy in.
func (r *PolicyReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	var list v1alpha1.WatchBudgetList
	if err := r.Reader.List(ctx, &list); err != nil {
		return ctrl.Result{}, fmt.Errorf("list WatchBudgets: %w", err)
	}
	c := Compile(list.Items)
	r.Engine.SetPolicy(r.Clock.Now(), c.Policy)
	r.loaded.Store(&c)
	policyLoadsTotal.Inc()
	budgetsLoaded.WithLabelValues("Ready").Set(float64(len(c.Budgets)))
	budgetsLoaded.WithLabelValues("Invalid").Set(float64(len(c.Invalid)))
	log := logf.FromContext(ctx)
	log.V(1).Info("Loaded policy", "budgets", len(c.Budgets), "invalid", len(c.Invalid))
	for name, err := range c.Invalid {
		log.V(2).Info("Left out invalid budget", "watchBudget", name, "reason", err.Error())
	}
	return ctrl.Result{}, nil
}

// Generations returns, for each budget of the policy in the engine, the
// generation that was compiled; nil before the first compile.
func (r *PolicyReconciler) Generations() map[string]int64 {
	c := r.loaded.Load()
	if c == nil {
		return nil
	}
	return maps.Clone(c.Generations)
}

// Loaded reports whether a policy has been compiled from a synced cache.
func (r *PolicyReconciler) Loaded() bool { return r.loaded.Load() != nil }

// Check is a healthz.Checker for /readyz: it fails until the first policy is
// loaded, so that no replica serves before it knows the budgets.
func (r *PolicyReconciler) Check(*http.Request) error {
	if !r.Loaded() {
		return errors.New("WatchBudgets not loaded yet")
	}
	return nil
}
