package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
)

// TestChartSwitchToEnforceKeepsTheObservation follows the first week's
// switch to Enforce through the chart: `helm upgrade --set
// defaultBudget.enforcement=Enforce` changes the replicas' flags, so the
// Deployment rolls — a new replica starts with the new bootstrap budgets
// (maxSurge 1), then the old one stops. The old replica's sketch outlives
// it: the suggestion still counts the identities it observed, from the
// same since, while the new leader switches the budget to Enforce in
// place.
func TestChartSwitchToEnforceKeepsTheObservation(t *testing.T) {
	ctx := context.Background()
	const install = "watchgate-roll"
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: install}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	def := install + "-default"
	cleanupBudgets(t, install+"-exempt", def)
	chart := func(enforcement string) []controllers.BootstrapBudget {
		set := bootstrapSet(install, 60)
		set[0].Spec["enforcement"] = enforcement
		set[0].Spec["subjects"] = []any{map[string]any{"kind": "User", "name": "roll-*"}}
		return set
	}
	opts := controllers.Options{PodName: "roll-0", Namespace: install, Bootstrap: chart("DryRun"), CounterRefreshInterval: 100 * time.Millisecond}
	old := startReplica(t, replicaOptions{Options: opts, leaseNamespace: install})
	select {
	case <-old.elected:
	case <-time.After(30 * time.Second):
		t.Fatal("the first replica was not elected")
	}
	eventually(t, reloadDeadline, "the bootstrapped budget reaches the engine", func() error {
		_, err := policyBudget(old.engine, def)
		return err
	})
	watch := func(e *ratelimit.Engine, user string) {
		t.Helper()
		d := e.Decide(time.Now(), &ratelimit.Request{User: user, Verb: ratelimit.VerbWatch, Resource: "pods", ResourceVersion: "5"})
		if !d.Allowed || d.Budget != def {
			t.Fatalf("%s's watch: %+v", user, d)
		}
	}
	for u := range 3 {
		watch(old.engine, fmt.Sprint("roll-", u))
	}
	var since metav1.Time
	eventually(t, 10*time.Second, "a suggestion from 3 identities", budgetIs(def, func(wb *v1alpha1.WatchBudget) error {
		s := wb.Status.Suggested
		if s == nil || s.Identities != 3 || s.Since == nil {
			return fmt.Errorf("suggested %+v", s)
		}
		since = *s.Since
		return nil
	}))

	// The rollout: the new replica first, with the new values; it follows
	// while the old one leads.
	opts.PodName, opts.Bootstrap = "roll-1", chart("Enforce")
	next := startReplica(t, replicaOptions{Options: opts, leaseNamespace: install})
	watch(next.engine, "roll-3")
	old.stop()

	eventually(t, 30*time.Second, "the new leader enforces the budget", func() error {
		b, err := policyBudget(next.engine, def)
		if err == nil && b.Enforcement != ratelimit.Enforce {
			err = fmt.Errorf("enforcement %s", b.Enforcement)
		}
		return err
	})
	eventually(t, 10*time.Second, "the suggestion rests on both replicas' identities, from the same since", budgetIs(def, func(wb *v1alpha1.WatchBudget) error {
		if len(wb.Status.Replicas) != 1 || wb.Status.Replicas[0].Pod != "roll-1" {
			return fmt.Errorf("entries %+v, want roll-1's alone", wb.Status.Replicas)
		}
		s := wb.Status.Suggested
		if s == nil || s.Identities != 4 || s.Since == nil || !s.Since.Equal(&since) {
			return fmt.Errorf("suggested %+v, want 4 identities since %s", s, since)
		}
		return nil
	}))
	if gone := getBudget(t, def).Status.ObservedByGoneReplicas; gone == nil || gone.Identities != 3 {
		t.Errorf("observedByGoneReplicas %+v, want roll-0's 3 identities", gone)
	}
}

// A replica that crashed cannot hand its sketch over; the leader that
// prunes its entry keeps the sketch in status.observedByGoneReplicas, in
// the same patch, and the suggestion counts it. A second one pruned later
// adds to it.
func TestPrunedReplicasSketchIsKept(t *testing.T) {
	ctx := context.Background()
	const ns, name = "watchgate-prune-sketch", "prune-sketch"
	if _, err := env.ServiceAccount(ctx, ns, "default"); err != nil { // creates the namespace too
		t.Fatal(err)
	}
	createPod(t, ns, "sketch-live")
	startReplica(t, replicaOptions{Options: controllers.Options{PodName: "sketch-live", Namespace: ns, PruneInterval: 100 * time.Millisecond}})
	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "prune-sketch-*"}}},
	})
	since := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	crashed := func(pod string, identities int64) {
		t.Helper()
		buckets := []any{map[string]any{"le": int64(5), "count": identities}}
		ghost := map[string]any{
			"pod": pod, "namespace": ns, "lastUpdateTime": time.Now().UTC().Format(time.RFC3339),
			"observed": map[string]any{
				"since": since.UTC().Format(time.RFC3339), "identities": identities,
				"watchOpensPerMinute": buckets, "watchBurst": buckets, "concurrentWatches": buckets,
			},
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "WatchBudget",
			"metadata": map[string]any{"name": name},
			"status":   map[string]any{"replicas": []any{ghost}},
		}}
		if err := admin.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("watchgate-replica-"+pod), client.ForceOwnership); err != nil {
			t.Fatal(err)
		}
	}
	keeps := func(identities int64) func() error {
		return budgetIs(name, func(wb *v1alpha1.WatchBudget) error {
			for _, r := range wb.Status.Replicas {
				if r.Pod != "sketch-live" {
					return fmt.Errorf("%s's entry not pruned yet", r.Pod)
				}
			}
			gone, s := wb.Status.ObservedByGoneReplicas, wb.Status.Suggested
			switch {
			case gone == nil || gone.Identities != identities || !gone.Since.Equal(&since):
				return fmt.Errorf("observedByGoneReplicas %+v, want %d identities since %s", gone, identities, since)
			case s == nil || s.Identities != identities || s.Since == nil || !s.Since.Equal(&since) || s.WatchOpensPerMinute != 8:
				return fmt.Errorf("suggested %+v, want 8/min from %d identities since %s", s, identities, since)
			}
			return nil
		})
	}
	crashed("sketch-crashed-0", 2)
	eventually(t, 10*time.Second, "the crashed replica's sketch kept", keeps(2))
	crashed("sketch-crashed-1", 3)
	eventually(t, 10*time.Second, "the second one's added", keeps(5))
}

// Replicas that stop at once (a scale-down, a node drained) all keep
// their sketches: each patch tests what it read, and the one that lost
// the race reads again and adds to what the other wrote.
func TestReplicasStoppingAtOnceKeepEverySketch(t *testing.T) {
	const name = "gone-together"
	opts := controllers.Options{CounterRefreshInterval: 100 * time.Millisecond}
	var replicas []*replica
	for i := range 3 {
		opts.PodName = fmt.Sprint("gone-together-", i)
		replicas = append(replicas, startReplica(t, replicaOptions{Options: opts}))
	}
	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.WatchBudgetSpec{
			Enforcement: v1alpha1.EnforcementDryRun,
			Subjects:    []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "gone-together-*"}},
		},
	})
	for i, r := range replicas {
		eventually(t, reloadDeadline, "the budget reaches the engine", func() error {
			_, err := policyBudget(r.engine, name)
			return err
		})
		// Replica i observes i+1 identities.
		for u := range i + 1 {
			r.engine.Decide(time.Now(), &ratelimit.Request{User: fmt.Sprintf("gone-together-%d-%d", i, u), Verb: ratelimit.VerbWatch, Resource: "pods", ResourceVersion: "5"})
		}
	}
	eventually(t, 10*time.Second, "a suggestion from the three replicas", budgetIs(name, func(wb *v1alpha1.WatchBudget) error {
		if s := wb.Status.Suggested; s == nil || s.Identities != 6 {
			return fmt.Errorf("suggested %+v", s)
		}
		return nil
	}))
	done := make(chan struct{})
	for _, r := range replicas {
		go func() { r.stop(); done <- struct{}{} }()
	}
	for range replicas {
		<-done
	}
	wb := getBudget(t, name)
	if len(wb.Status.Replicas) != 0 {
		t.Errorf("entries left: %+v", wb.Status.Replicas)
	}
	if gone := wb.Status.ObservedByGoneReplicas; gone == nil || gone.Identities != 6 {
		t.Errorf("observedByGoneReplicas %+v, want the 6 identities of the three", gone)
	}
}
