package controllers

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/api/v1alpha1"
	wbac "github.com/watchgate/watchgate/api/v1alpha1/applyconfiguration/api/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

// +kubebuilder:rbac:groups=watchgate.io,resources=watchbudgets/status,verbs=get;update;patch

// fieldOwnerController is the field manager of the leader's status fields:
// the Ready condition and the sums.
const fieldOwnerController = "watchgate-controller"

// replicaFieldOwner is the field manager of one replica's entry in
// status.replicas. Field managers are at most 128 characters; a longer pod
// name is cut and suffixed with a hash, so that it stays unique.
func replicaFieldOwner(pod string) string {
	const prefix, maxLen = "watchgate-replica-", 128
	name := prefix + pod
	if len(name) <= maxLen {
		return name
	}
	h := fnv.New64a()
	h.Write([]byte(pod))
	suffix := fmt.Sprintf("-%016x", h.Sum64())
	return name[:maxLen-len(suffix)] + suffix
}

// rejections is the number of decisions that had (or, in DryRun, would have
// had) a reason.
func rejections(st ratelimit.BudgetStats) int64 {
	var n int64
	for reason, count := range st.Decisions {
		if reason != ratelimit.ReasonAllowed {
			n += count
		}
	}
	return n
}

// replicaEntry is one replica's status entry for a budget. Zero counts are
// left out of decisions.
func replicaEntry(pod string, generation int64, st ratelimit.BudgetStats, recent int64, now time.Time) v1alpha1.ReplicaStatus {
	e := v1alpha1.ReplicaStatus{
		Pod:                pod,
		ObservedGeneration: generation,
		ActiveWatches:      st.ActiveWatches,
		TrackedIdentities:  st.TrackedIdentities,
		RecentRejections:   recent,
		Observed:           observedEntry(&st.Observed),
		LastUpdateTime:     metav1.NewTime(now),
	}
	for reason, count := range st.Decisions {
		if count == 0 {
			continue
		}
		if e.Decisions == nil {
			e.Decisions = map[string]int64{}
		}
		e.Decisions[string(reason)] = count
	}
	for _, o := range st.TopOffenders[:min(len(st.TopOffenders), 5)] {
		user := o.User
		if len(user) > 1024 {
			user = user[:1024]
		}
		e.TopOffenders = append(e.TopOffenders, v1alpha1.Offender{User: user, Rejections: o.Rejections})
	}
	return e
}

// needsWrite reports whether next is worth writing over current: when any
// figure but the cumulative decision counts and the observed peaks'
// buckets differs (the number of identities observed does count), or when
// only those differ and current is at least counterRefresh old (by next's
// lastUpdateTime). Counts grow with every admitted request, so writing on
// each change would rewrite every busy budget's entry every tick.
func needsWrite(current, next v1alpha1.ReplicaStatus, counterRefresh time.Duration) bool {
	if !sameGauges(current, next) {
		return true
	}
	return (!maps.Equal(current.Decisions, next.Decisions) || !sameObserved(current.Observed, next.Observed)) &&
		next.LastUpdateTime.Sub(current.LastUpdateTime.Time) >= counterRefresh
}

// sameGauges reports whether two entries agree on everything but the
// cumulative decision counts, the observed peaks' buckets and
// lastUpdateTime. A busy identity's peaks climb through the buckets all
// through its busiest minute, so they are refreshed like the counts; a new
// identity observed is written at once, as it is in trackedIdentities.
func sameGauges(a, b v1alpha1.ReplicaStatus) bool {
	return a.Pod == b.Pod && a.Namespace == b.Namespace &&
		a.ObservedGeneration == b.ObservedGeneration &&
		a.ActiveWatches == b.ActiveWatches &&
		a.TrackedIdentities == b.TrackedIdentities &&
		a.RecentRejections == b.RecentRejections &&
		slices.Equal(a.TopOffenders, b.TopOffenders) &&
		observedIdentities(a) == observedIdentities(b)
}

// observedIdentities is the number of identities e's sketch counts, or
// -1 without a sketch.
func observedIdentities(e v1alpha1.ReplicaStatus) int64 {
	if e.Observed == nil {
		return -1
	}
	return e.Observed.Identities
}

// findReplica returns pod's entry, or nil.
func findReplica(st *v1alpha1.WatchBudgetStatus, pod string) *v1alpha1.ReplicaStatus {
	for i := range st.Replicas {
		if st.Replicas[i].Pod == pod {
			return &st.Replicas[i]
		}
	}
	return nil
}

// sums adds up the replicas' entries into the figures `kubectl get wb`
// shows.
func sums(replicas []v1alpha1.ReplicaStatus) (activeWatches, recentRejections int64) {
	for _, r := range replicas {
		activeWatches += r.ActiveWatches
		recentRejections += r.RecentRejections
	}
	return activeWatches, recentRejections
}

// applyStatus server-side applies status (the fields owner wants to own, and
// nothing else) to the named WatchBudget's status subresource. Fields owner
// owned before and left out of status are removed. A budget that is gone is
// not recreated: the API server answers NotFound.
func applyStatus(ctx context.Context, c client.Client, name string, status *wbac.WatchBudgetStatusApplyConfiguration, owner string) error {
	wb := wbac.WatchBudget(name).WithStatus(status)
	err := c.Status().Apply(ctx, wb, client.FieldOwner(owner), client.ForceOwnership)
	if err != nil {
		return fmt.Errorf("apply status of WatchBudget %s as %s: %w", name, owner, err)
	}
	return nil
}

// replicaApply is the apply configuration of a replica's entry: every field
// the entry's JSON holds (those with omitempty only when set).
func replicaApply(e *v1alpha1.ReplicaStatus) *wbac.ReplicaStatusApplyConfiguration {
	a := wbac.ReplicaStatus().
		WithPod(e.Pod).
		WithObservedGeneration(e.ObservedGeneration).
		WithActiveWatches(e.ActiveWatches).
		WithTrackedIdentities(e.TrackedIdentities).
		WithRecentRejections(e.RecentRejections).
		WithLastUpdateTime(e.LastUpdateTime)
	if e.Namespace != "" {
		a.WithNamespace(e.Namespace)
	}
	if len(e.Decisions) > 0 {
		a.WithDecisions(e.Decisions)
	}
	for _, o := range e.TopOffenders {
		a.WithTopOffenders(wbac.Offender().WithUser(o.User).WithRejections(o.Rejections))
	}
	if e.Observed != nil {
		a.WithObserved(observedApply(e.Observed))
	}
	return a
}

// conditionApply is the apply configuration of a condition.
func conditionApply(c metav1.Condition) *metav1ac.ConditionApplyConfiguration {
	return metav1ac.Condition().
		WithType(c.Type).
		WithStatus(c.Status).
		WithObservedGeneration(c.ObservedGeneration).
		WithLastTransitionTime(c.LastTransitionTime).
		WithReason(c.Reason).
		WithMessage(c.Message)
}
