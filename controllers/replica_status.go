package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/watchgate/watchgate/api/v1alpha1"
	wbac "github.com/watchgate/watchgate/api/v1alpha1/applyconfiguration/api/v1alpha1"
	"github.com/watchgate/watchgate/internal/periodic"
	"github.com/watchgate/watchgate/ratelimit"
)

// DefaultStatusInterval is how often a replica considers writing its status
// entries.
const DefaultStatusInterval = 15 * time.Second

// DefaultCounterRefreshInterval is how stale a replica lets the cumulative
// decision counts (status.replicas[].decisions) of an entry become when
// nothing else in it changed. Every admitted request adds to them, so
// writing each change would rewrite the entry of every busy budget every
// DefaultStatusInterval even when its active watches, identities, recent
// rejections and offenders stay put; refreshing them every 5 minutes keeps
// an idle-but-busy budget to one write per replica per 5 minutes.
const DefaultCounterRefreshInterval = 5 * time.Minute

// ReplicaStatusWriter writes this replica's live figures for each budget
// into the budget's status.replicas, in the entry keyed by its pod name.
// Every replica runs one (it does not need leader election).
//
// Every Interval it reads the engine's Stats and, for each budget whose
// figures differ from its entry in the cache, applies the new entry: at once
// when anything but the cumulative decision counts and the buckets of the
// observed peaks changed (active watches, identities, recent rejections,
// offenders, observed generation, identities observed), and when only
// those changed once the entry is CounterRefreshInterval old. It
// applies the new entry with server-side apply under a field manager of its own
// (watchgate-replica-<pod>). Each replica thus owns exactly its own entry:
// concurrent writers never conflict and never remove each other's entries.
// A budget that leaves the policy (deleted, or now invalid) loses this
// replica's entry; on shutdown the replica removes all its entries, since
// its figures stop being live. Either way the entry's sketch of observed
// peaks is kept in status.observedByGoneReplicas (suggest_gone.go): on
// shutdown the engine's, newer than the entry's.
type ReplicaStatusWriter struct {
	// Client writes the status.
	Client client.Client
	// Reader reads WatchBudgets, normally the manager's cache.
	Reader client.Reader
	// APIReader reads a budget again when removing an entry raced with
	// another change of its status; normally the manager's API reader
	// (the cache may have stopped by then). Nil: Reader.
	APIReader client.Reader
	// Engine supplies the figures.
	Engine Engine
	// Policy tells which generation of each budget the engine enforces.
	Policy *PolicyReconciler
	// Pod is this replica's pod name, the key of its entries.
	Pod string
	// Namespace is this replica's pod's namespace, written in its entries
	// so that only its own install's leader prunes them; may be empty.
	Namespace string
	// Interval between writes; DefaultStatusInterval when zero.
	Interval time.Duration
	// CounterRefreshInterval is how long an entry whose only change is in
	// its cumulative decision counts waits before it is rewritten;
	// DefaultCounterRefreshInterval when zero.
	CounterRefreshInterval time.Duration
	// Clock ticks the writes and stamps lastUpdateTime; SetupWithManager
	// sets it (a fake one in tests).
	Clock clock.Clock

	history map[string]*rejectionHistory
}

// NeedLeaderElection is false: every replica reports its own figures.
func (w *ReplicaStatusWriter) NeedLeaderElection() bool { return false }

// Start writes every Interval until ctx ends, then removes this replica's
// entries (with a fresh 5 s deadline, as ctx is already done).
func (w *ReplicaStatusWriter) Start(ctx context.Context) error {
	interval := w.Interval
	if interval <= 0 {
		interval = DefaultStatusInterval
	}
	log := logf.FromContext(ctx).WithName("replica-status").WithValues("pod", w.Pod)
	ctx = logf.IntoContext(ctx, log)
	periodic.Every(ctx, w.Clock, interval, func(ctx context.Context) {
		// A failed write is retried on the next tick.
		if err := w.Write(ctx); err != nil {
			log.Error(err, "Failed to write status entries")
		}
	})
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := w.Remove(cleanup); err != nil {
		log.Error(err, "Failed to remove this replica's status entries")
	}
	return nil
}

// Write brings this replica's entry of every budget up to date, writing
// only those that changed.
func (w *ReplicaStatusWriter) Write(ctx context.Context) error {
	gens := w.Policy.Generations()
	if gens == nil {
		return nil // no policy yet: nothing this replica could report
	}
	stats := w.Engine.Stats()
	var list v1alpha1.WatchBudgetList
	if err := w.Reader.List(ctx, &list); err != nil {
		return err
	}
	if w.history == nil {
		w.history = map[string]*rejectionHistory{}
	}
	now := w.Clock.Now()
	var errs []error
	seen := make(map[string]bool, len(list.Items))
	for i := range list.Items {
		wb := &list.Items[i]
		seen[wb.Name] = true
		current := findReplica(&wb.Status, w.Pod)
		st, inStats := stats[wb.Name]
		gen, inPolicy := gens[wb.Name]
		if !inStats || !inPolicy {
			delete(w.history, wb.Name)
			if current != nil {
				errs = append(errs, w.retire(ctx, wb, nil))
			}
			continue
		}
		h := w.history[wb.Name]
		if h == nil {
			h = &rejectionHistory{}
			w.history[wb.Name] = h
		}
		entry := replicaEntry(w.Pod, gen, st, h.observe(now, rejections(st), recentWindow), now)
		entry.Namespace = w.Namespace
		if current != nil && !needsWrite(*current, entry, w.counterRefresh()) {
			continue
		}
		errs = append(errs, w.apply(ctx, wb.Name, &entry))
	}
	for name := range w.history {
		if !seen[name] {
			delete(w.history, name)
		}
	}
	return errors.Join(errs...)
}

func (w *ReplicaStatusWriter) counterRefresh() time.Duration {
	if w.CounterRefreshInterval <= 0 {
		return DefaultCounterRefreshInterval
	}
	return w.CounterRefreshInterval
}

// Remove deletes this replica's entry from every budget that has one,
// keeping the engine's sketch of each in status.observedByGoneReplicas.
func (w *ReplicaStatusWriter) Remove(ctx context.Context) error {
	var list v1alpha1.WatchBudgetList
	if err := w.Reader.List(ctx, &list); err != nil {
		return err
	}
	stats := w.Engine.Stats()
	var errs []error
	for i := range list.Items {
		wb := &list.Items[i]
		if findReplica(&wb.Status, w.Pod) == nil {
			continue
		}
		var fresh *ratelimit.ObservedPeaks
		if st, ok := stats[wb.Name]; ok && !st.Observed.Since.IsZero() {
			fresh = &st.Observed
		}
		errs = append(errs, w.retire(ctx, wb, fresh))
	}
	return errors.Join(errs...)
}

// retireAttempts bounds how often retire builds its patch again.
const retireAttempts = 5

// retire removes this replica's entry from wb (as read), adding its sketch
// — fresh when given, else the entry's — to status.observedByGoneReplicas.
// When the status changed meanwhile it reads the budget again and retries.
func (w *ReplicaStatusWriter) retire(ctx context.Context, wb *v1alpha1.WatchBudget, fresh *ratelimit.ObservedPeaks) error {
	reader := w.APIReader
	if reader == nil {
		reader = w.Reader
	}
	mine := func(e *v1alpha1.ReplicaStatus) bool { return e.Pod == w.Pod }
	name := wb.Name
	var err error
	for range retireAttempts {
		ops := retireOps(wb, mine, map[string]*ratelimit.ObservedPeaks{w.Pod: fresh})
		if len(ops) == 0 {
			return nil
		}
		err = patchOps(ctx, w.Client, wb, ops, replicaFieldOwner(w.Pod))
		if !apierrors.IsConflict(err) {
			break
		}
		wb = &v1alpha1.WatchBudget{}
		if gerr := reader.Get(ctx, client.ObjectKey{Name: name}, wb); gerr != nil {
			return client.IgnoreNotFound(gerr)
		}
	}
	if err != nil {
		statusWritesTotal.WithLabelValues("error").Inc()
		return fmt.Errorf("remove the status entry of %s from WatchBudget %s: %w", w.Pod, name, err)
	}
	statusWritesTotal.WithLabelValues("success").Inc()
	logf.FromContext(ctx).V(2).Info("Removed status entry", "watchBudget", name)
	return nil
}

// apply writes entry as this replica's only entry of the budget; a nil
// entry removes it. A budget deleted meanwhile is not an error.
func (w *ReplicaStatusWriter) apply(ctx context.Context, name string, entry *v1alpha1.ReplicaStatus) error {
	status := wbac.WatchBudgetStatus()
	if entry != nil {
		status.WithReplicas(replicaApply(entry))
	}
	err := applyStatus(ctx, w.Client, name, status, replicaFieldOwner(w.Pod))
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		statusWritesTotal.WithLabelValues("error").Inc()
		return err
	}
	statusWritesTotal.WithLabelValues("success").Inc()
	logf.FromContext(ctx).V(2).Info("Wrote status entry", "watchBudget", name, "removed", entry == nil)
	return nil
}
