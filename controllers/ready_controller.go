package controllers

import (
	"context"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/watchgate/watchgate/api/v1alpha1"
	wbac "github.com/watchgate/watchgate/api/v1alpha1/applyconfiguration/api/v1alpha1"
)

// maxConditionMessage is metav1.Condition's limit on Message.
const maxConditionMessage = 32768

// ReadyReconciler maintains the status fields that are about the budget as
// a whole: the Ready condition, the sums over the replicas' entries
// (status.activeWatches, status.recentRejections), the limits as
// `kubectl get wb` shows them (status.limits, "-" when Exempt) and the
// limits suggested from the replicas' observed peaks (status.suggested,
// see suggestedLimits). It runs on the leader only, so one writer owns
// these fields (field manager watchgate-controller, server-side apply). Without leader
// election every replica runs it; they then compute the same values from
// the same objects and apply them under the same field manager, which is
// harmless.
//
// Ready is True (reason Compiled) when the spec is valid, False (reason
// InvalidSpec, the message says what is wrong) when it is not; its
// observedGeneration is the generation judged. Whether a given replica
// already enforces that generation is in its entry's observedGeneration.
//
// It watches the whole object, status included, because the sums change
// when replicas write; it writes only when something changed.
type ReadyReconciler struct {
	// Client reads WatchBudgets (from the cache) and writes their status.
	Client client.Client
	// Clock stamps lastTransitionTime; SetupWithManager sets it (a fake
	// one in tests).
	Clock clock.PassiveClock
}

// SetupWithManager registers the reconciler; it needs leader election.
func (r *ReadyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("watchbudget-ready").
		For(&v1alpha1.WatchBudget{}).
		Complete(r)
}

// Reconcile sets one budget's Ready condition and sums.
func (r *ReadyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	var wb v1alpha1.WatchBudget
	if err := r.Client.Get(ctx, req.NamespacedName, &wb); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	budget, invalid := ToBudget(&wb)
	ready := readyCondition(&wb, invalid, r.Clock.Now())
	// Keep lastTransitionTime when the status does not change.
	conds := append([]metav1.Condition(nil), wb.Status.Conditions...)
	meta.SetStatusCondition(&conds, ready)
	ready = *meta.FindStatusCondition(conds, v1alpha1.ConditionReady)
	active, recent := sums(wb.Status.Replicas)
	limits := shownLimits(&wb.Spec)
	var suggested *v1alpha1.SuggestedLimits
	if invalid == nil {
		suggested = suggestedLimits(&budget, &wb.Status)
	}

	old := meta.FindStatusCondition(wb.Status.Conditions, v1alpha1.ConditionReady)
	if old != nil && sameCondition(*old, ready) && wb.Status.ActiveWatches == active && wb.Status.RecentRejections == recent &&
		wb.Status.Limits != nil && *wb.Status.Limits == limits && sameSuggested(wb.Status.Suggested, suggested) {
		return ctrl.Result{}, nil
	}
	status := wbac.WatchBudgetStatus().
		WithConditions(conditionApply(ready)).
		WithActiveWatches(active).
		WithRecentRejections(recent).
		WithLimits(wbac.ShownLimits().
			WithWatchOpensPerMinute(limits.WatchOpensPerMinute).
			WithWatchBurst(limits.WatchBurst).
			WithMaxConcurrentWatches(limits.MaxConcurrentWatches).
			WithAggregateMaxConcurrentWatches(limits.AggregateMaxConcurrentWatches))
	if suggested != nil {
		status.WithSuggested(suggestedApply(suggested))
	}
	return ctrl.Result{}, client.IgnoreNotFound(applyStatus(ctx, r.Client, wb.Name, status, fieldOwnerController))
}

// readyCondition judges the spec: invalid is why ToBudget refused it, or
// nil.
func readyCondition(wb *v1alpha1.WatchBudget, invalid error, now time.Time) metav1.Condition {
	c := metav1.Condition{
		Type:               v1alpha1.ConditionReady,
		Status:             metav1.ConditionTrue,
		ObservedGeneration: wb.Generation,
		LastTransitionTime: metav1.NewTime(now),
		Reason:             v1alpha1.ReasonCompiled,
		Message:            "The budget is valid and part of the policy; status.replicas tells which generation each proxy replica enforces",
	}
	if invalid != nil {
		c.Status = metav1.ConditionFalse
		c.Reason = v1alpha1.ReasonInvalidSpec
		c.Message = "The budget is ignored: " + invalid.Error()
		if len(c.Message) > maxConditionMessage {
			c.Message = c.Message[:maxConditionMessage]
		}
	}
	return c
}

// shownLimits are spec's limits and aggregate cap as text: "-" for each
// when the budget is Exempt, which ignores them; "" for one the spec leaves
// unset (the API server defaults the limits; an unset aggregate is no cap).
func shownLimits(spec *v1alpha1.WatchBudgetSpec) v1alpha1.ShownLimits {
	if spec.Enforcement == v1alpha1.EnforcementExempt {
		return v1alpha1.ShownLimits{WatchOpensPerMinute: "-", WatchBurst: "-", MaxConcurrentWatches: "-", AggregateMaxConcurrentWatches: "-"}
	}
	show := func(v *int32) string {
		if v == nil {
			return ""
		}
		return strconv.Itoa(int(*v))
	}
	l := &spec.Limits
	shown := v1alpha1.ShownLimits{WatchOpensPerMinute: show(l.WatchOpensPerMinute), WatchBurst: show(l.WatchBurst), MaxConcurrentWatches: show(l.MaxConcurrentWatches)}
	if a := spec.Aggregate; a != nil {
		shown.AggregateMaxConcurrentWatches = show(a.MaxConcurrentWatches)
	}
	return shown
}

// sameCondition compares what a condition says, timestamps aside.
func sameCondition(a, b metav1.Condition) bool {
	return a.Type == b.Type && a.Status == b.Status && a.ObservedGeneration == b.ObservedGeneration &&
		a.Reason == b.Reason && a.Message == b.Message
}
