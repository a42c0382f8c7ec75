package controllers

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

// The observation outlives the replicas that made it. A replica's sketch
// lives in its status entry, and the entry goes with the replica: one that
// stops removes its entries (ReplicaStatusWriter), the leader prunes those
// of replicas that crashed (ReplicaPruner). Either way the entry's sketch
// is added to status.observedByGoneReplicas in the JSON patch that removes
// the entry, so that the suggestion rests on everything observed since its
// since through a rollout — the helm upgrade that switches a budget to
// Enforce, an upgrade of watchgate — a drained node or a crash. Keeping it
// in the budget's status, rather than keeping the pods from restarting,
// covers every restart alike; it costs one sketch per budget (at most
// 6·120 buckets; in practice a few dozen).
//
// The patch is applied only over what it read: a test of each removed
// entry's pod name at its index, and a test of observedByGoneReplicas's
// identities — which only grows, so an equal count means no other replica
// added to it meanwhile — or, while there is none, of the budget's
// resourceVersion. A patch that fails a test is read and built again.

// retireOps are the JSON patch operations that remove the entries of wb's
// status for which gone is true and add their sketches to
// status.observedByGoneReplicas: fresh[pod], when set, in place of the
// sketch the entry holds (a stopping replica's, newer than what it last
// wrote). Nil when no entry is gone.
func retireOps(wb *v1alpha1.WatchBudget, gone func(*v1alpha1.ReplicaStatus) bool, fresh map[string]*ratelimit.ObservedPeaks) []jsonPatchOp {
	var ops []jsonPatchOp
	var sum ratelimit.ObservedPeaks
	before := int64(0)
	if g := wb.Status.ObservedByGoneReplicas; g != nil {
		sum = peaksOf(g)
		before = g.Identities
	}
	// From the end, so that earlier indexes stay right.
	for j := len(wb.Status.Replicas) - 1; j >= 0; j-- {
		e := &wb.Status.Replicas[j]
		if !gone(e) {
			continue
		}
		path := fmt.Sprintf("/status/replicas/%d", j)
		ops = append(ops, jsonPatchOp{Op: "test", Path: path + "/pod", Value: e.Pod}, jsonPatchOp{Op: "remove", Path: path})
		switch {
		case fresh[e.Pod] != nil:
			sum.Merge(fresh[e.Pod])
		case e.Observed != nil:
			one := peaksOf(e.Observed)
			sum.Merge(&one)
		}
	}
	if len(ops) == 0 || sum.Identities == before {
		return ops
	}
	const path = "/status/observedByGoneReplicas"
	if wb.Status.ObservedByGoneReplicas == nil {
		return append(ops,
			jsonPatchOp{Op: "test", Path: "/metadata/resourceVersion", Value: wb.ResourceVersion},
			jsonPatchOp{Op: "add", Path: path, Value: observedEntry(&sum)})
	}
	return append(ops,
		jsonPatchOp{Op: "test", Path: path + "/identities", Value: before},
		jsonPatchOp{Op: "replace", Path: path, Value: observedEntry(&sum)})
}

// patchOps applies ops to wb's status as owner. A test that failed (the
// status changed since it was read) is a Conflict; a budget that is gone
// is not an error.
func patchOps(ctx context.Context, c client.Client, wb *v1alpha1.WatchBudget, ops []jsonPatchOp, owner string) error {
	raw, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	err = c.Status().Patch(ctx, wb, client.RawPatch(types.JSONPatchType, raw), client.FieldOwner(owner))
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsInvalid(err):
		// How the API server answers a failed test.
		return apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("watchbudgets").GroupResource(), wb.Name, err)
	}
	return err
}
