package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/internal/periodic"
)

// +kubebuilder:rbac:groups="",namespace=watchgate-system,resources=pods,verbs=list

// DefaultPruneInterval is how often the leader looks for entries of replicas
// that are gone.
const DefaultPruneInterval = time.Minute

// ReplicaPruner removes from status.replicas the entries of replicas whose
// pod no longer exists in Namespace: a replica that stops cleanly removes
// its own entries, one that crashes or is evicted cannot. It runs on the
// leader only. An entry that names another namespace belongs to another
// install sharing the CRD, whose own leader prunes it; an entry without a
// namespace (a replica outside a cluster) is pruned by any leader that
// finds no pod of its name.
//
// It prunes only while this replica's own pod, Pod, is in Namespace: that
// is what tells it that the replicas run as pods there. A process that is
// no pod of Namespace (run outside the cluster, its namespace named by
// hand) cannot tell a gone replica from one running elsewhere, and prunes
// nothing.
//
// An entry belongs to another field manager (its replica's), so applying
// cannot remove it; the pruner sends a JSON patch that tests the entry's pod
// name at its index before removing it, so that a concurrent change of the
// list makes the patch fail (and the next round retry) rather than remove
// the wrong entry. The same patch keeps the entry's sketch of observed
// peaks in status.observedByGoneReplicas (suggest_gone.go).
type ReplicaPruner struct {
	// Client patches status.
	Client client.Client
	// Reader reads WatchBudgets, normally the manager's cache.
	Reader client.Reader
	// PodReader lists pods; normally the manager's API reader (uncached), so
	// that watchgate does not cache every pod of its namespace.
	PodReader client.Reader
	// Namespace the replicas' pods run in. Empty disables pruning.
	Namespace string
	// Pod is this replica's pod name; while no pod of that name is in
	// Namespace, a round prunes nothing.
	Pod string
	// Interval between rounds; DefaultPruneInterval when zero.
	Interval time.Duration
	// Clock ticks the rounds; SetupWithManager sets it (a fake one in tests).
	Clock clock.Clock
}

// NeedLeaderElection is true: one pruner is enough.
func (p *ReplicaPruner) NeedLeaderElection() bool { return true }

// Start prunes every Interval until ctx ends.
func (p *ReplicaPruner) Start(ctx context.Context) error {
	if p.Namespace == "" {
		return nil
	}
	interval := p.Interval
	if interval <= 0 {
		interval = DefaultPruneInterval
	}
	log := logf.FromContext(ctx).WithName("replica-pruner").WithValues("namespace", p.Namespace)
	periodic.Every(logf.IntoContext(ctx, log), p.Clock, interval, func(ctx context.Context) {
		// A failed round is retried on the next tick.
		if err := p.Prune(ctx); err != nil {
			log.Error(err, "Failed to prune status entries of gone replicas")
		}
	})
	return nil
}

// Prune removes, from every budget, the entries of pods that do not exist
// in Namespace; nothing when this replica's own pod is not there.
func (p *ReplicaPruner) Prune(ctx context.Context) error {
	var pods metav1.PartialObjectMetadataList
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := p.PodReader.List(ctx, &pods, client.InNamespace(p.Namespace)); err != nil {
		return fmt.Errorf("list pods in %s: %w", p.Namespace, err)
	}
	live := make(map[string]bool, len(pods.Items))
	for _, pod := range pods.Items {
		live[pod.Name] = true
	}
	if !live[p.Pod] {
		logf.FromContext(ctx).V(1).Info("Not pruning: this replica is no pod of the namespace", "pod", p.Pod)
		return nil
	}
	var list v1alpha1.WatchBudgetList
	if err := p.Reader.List(ctx, &list); err != nil {
		return err
	}
	var errs []error
	for i := range list.Items {
		wb := &list.Items[i]
		ops := retireOps(wb, func(e *v1alpha1.ReplicaStatus) bool {
			return !live[e.Pod] && (e.Namespace == "" || e.Namespace == p.Namespace)
		}, nil)
		if len(ops) == 0 {
			continue
		}
		err := patchOps(ctx, p.Client, wb, ops, fieldOwnerController)
		switch {
		case apierrors.IsConflict(err):
			// The status changed under us (the cache lagged); next round.
			logf.FromContext(ctx).V(1).Info("Status changed while pruning, will retry", "watchBudget", wb.Name, "reason", err.Error())
		case err != nil:
			errs = append(errs, fmt.Errorf("prune status entries of WatchBudget %s: %w", wb.Name, err))
		default:
			logf.FromContext(ctx).V(1).Info("Pruned status entries of gone replicas", "watchBudget", wb.Name)
		}
	}
	return errors.Join(errs...)
}

type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}
