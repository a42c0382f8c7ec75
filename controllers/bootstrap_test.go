package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
)

// bootstrapSet is an install's budgets as the chart's flag gives them: a
// mandatory Exempt budget last (so that seeing it updated means the
// others were reconciled before it), suggested ones first.
func bootstrapSet(prefix string, defaultOpens int, extra ...controllers.BootstrapBudget) []controllers.BootstrapBudget {
	set := []controllers.BootstrapBudget{{
		Name: prefix + "-default",
		Spec: map[string]any{
			"enforcement": "DryRun",
			"precedence":  int64(10000),
			"limits":      map[string]any{"watchOpensPerMinute": int64(defaultOpens), "watchBurst": int64(30)},
		},
	}}
	set = append(set, extra...)
	return append(set, controllers.BootstrapBudget{
		Name:      prefix + "-exempt",
		Mandatory: true,
		Labels:    map[string]string{"app.kubernetes.io/instance": prefix},
		Spec: map[string]any{
			"enforcement": "Exempt",
			"precedence":  int64(1),
			"subjects":    []any{map[string]any{"kind": "Group", "name": "system:masters"}},
		},
	})
}

func cleanupBudgets(t *testing.T, names ...string) {
	t.Cleanup(func() {
		for _, n := range names {
			_ = client.IgnoreNotFound(admin.Delete(context.Background(), &v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: n}}))
		}
	})
}

// budgetIs returns a condition that holds once budget name exists and
// check passes on it.
func budgetIs(name string, check func(*v1alpha1.WatchBudget) error) func() error {
	return func() error {
		var wb v1alpha1.WatchBudget
		if err := admin.Get(context.Background(), client.ObjectKey{Name: name}, &wb); err != nil {
			return err
		}
		return check(&wb)
	}
}

func opensPerMinute(want int32) func(*v1alpha1.WatchBudget) error {
	return func(wb *v1alpha1.WatchBudget) error {
		if got := ptr.Deref(wb.Spec.Limits.WatchOpensPerMinute, -1); got != want {
			return fmt.Errorf("watchOpensPerMinute = %d, want %d", got, want)
		}
		return nil
	}
}

// TestBootstrapKeepsMandatoryAndSuggestedBudgets runs the bootstrap
// reconciler as the leader of an install does: it creates the budgets,
// restores the mandatory one when deleted or edited, keeps a suggested one
// up to date until an operator takes it over with the annotation, and a
// restart with other values (a helm upgrade) updates what is still
// watchgate's and leaves what was taken over alone.
func TestBootstrapKeepsMandatoryAndSuggestedBudgets(t *testing.T) {
	ctx := context.Background()
	const install = "boot-a"
	exempt, def := install+"-exempt", install+"-default"
	cleanupBudgets(t, exempt, def)
	r := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "boot-a-0", Namespace: install, Bootstrap: bootstrapSet(install, 60)}})

	eventually(t, 10*time.Second, "both budgets are created", budgetIs(exempt, func(wb *v1alpha1.WatchBudget) error {
		if wb.Spec.Enforcement != v1alpha1.EnforcementExempt || wb.Annotations[controllers.AutoUpdateAnnotation] != "true" ||
			wb.Labels[controllers.BootstrapLabel] != install || wb.Labels["app.kubernetes.io/instance"] != install {
			return fmt.Errorf("not as bootstrapped: %v %v %v", wb.Spec.Enforcement, wb.Annotations, wb.Labels)
		}
		return nil
	}))
	eventually(t, 10*time.Second, "the suggested budget is created", budgetIs(def, opensPerMinute(60)))

	// Deleted: restored, as a new object.
	old := getBudget(t, exempt)
	if err := admin.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the deleted mandatory budget is restored", budgetIs(exempt, func(wb *v1alpha1.WatchBudget) error {
		if wb.UID == old.UID {
			return fmt.Errorf("still the old object")
		}
		return nil
	}))

	// Edited, even with the annotation set to false: restored.
	wb := getBudget(t, exempt)
	patch := client.MergeFrom(wb.DeepCopy())
	wb.Annotations[controllers.AutoUpdateAnnotation] = "false"
	wb.Spec.Enforcement = v1alpha1.EnforcementEnforce
	if err := admin.Patch(ctx, wb, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the edited mandatory budget is restored", budgetIs(exempt, func(wb *v1alpha1.WatchBudget) error {
		if wb.Spec.Enforcement != v1alpha1.EnforcementExempt || wb.Annotations[controllers.AutoUpdateAnnotation] != "true" {
			return fmt.Errorf("enforcement %s, annotation %q", wb.Spec.Enforcement, wb.Annotations[controllers.AutoUpdateAnnotation])
		}
		return nil
	}))

	// A suggested budget edited while still auto-updated: restored.
	wb = getBudget(t, def)
	patch = client.MergeFrom(wb.DeepCopy())
	wb.Spec.Limits.WatchOpensPerMinute = ptr.To[int32](5)
	if err := admin.Patch(ctx, wb, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the edited suggested budget is restored", budgetIs(def, opensPerMinute(60)))

	// Taken over: the operator's edit stays.
	wb = getBudget(t, def)
	patch = client.MergeFrom(wb.DeepCopy())
	wb.Annotations[controllers.AutoUpdateAnnotation] = "false"
	wb.Spec.Enforcement = v1alpha1.EnforcementEnforce
	wb.Spec.Limits.WatchOpensPerMinute = ptr.To[int32](7)
	if err := admin.Patch(ctx, wb, patch); err != nil {
		t.Fatal(err)
	}
	takenUID := wb.UID

	// A restart with new values (helm upgrade): the mandatory budget,
	// reconciled after the suggested one, gets the new subjects; the
	// taken-over budget keeps the operator's spec and its identity.
	r.stop()
	set := bootstrapSet(install, 90)
	set[1].Spec["subjects"] = []any{
		map[string]any{"kind": "Group", "name": "system:masters"},
		map[string]any{"kind": "User", "name": "system:kube-scheduler"},
	}
	startReplica(t, replicaOptions{Options: controllers.Options{PodName: "boot-a-1", Namespace: install, Bootstrap: set}})
	eventually(t, 10*time.Second, "the mandatory budget follows the new values", budgetIs(exempt, func(wb *v1alpha1.WatchBudget) error {
		if len(wb.Spec.Subjects) != 2 {
			return fmt.Errorf("subjects %v", wb.Spec.Subjects)
		}
		return nil
	}))
	got := getBudget(t, def)
	if got.UID != takenUID || got.Spec.Enforcement != v1alpha1.EnforcementEnforce || ptr.Deref(got.Spec.Limits.WatchOpensPerMinute, 0) != 7 {
		t.Errorf("the taken-over budget changed: uid %s (was %s), %s, %d opens/min", got.UID, takenUID, got.Spec.Enforcement, ptr.Deref(got.Spec.Limits.WatchOpensPerMinute, 0))
	}
}

// TestBootstrapAdoptsBudgetsOfTheHookChart starts from what the chart's
// former post-install hook left: budgets without the annotation, one of
// them edited since. The untouched one is brought up to date; the edited
// one is left to its operator and marked so, as API Priority and Fairness
// does. A budget that is no longer configured is deleted only when this
// install bootstrapped it and nobody took it over; another install's is
// never touched.
func TestBootstrapAdoptsBudgetsOfTheHookChart(t *testing.T) {
	ctx := context.Background()
	const install = "boot-b"
	def, agents, gone, theirs := install+"-default", install+"-agents", install+"-gone", "boot-other-default"
	cleanupBudgets(t, install+"-exempt", def, agents, gone, theirs)
	hookBudget := func(name string, opens int32, labels map[string]string) *v1alpha1.WatchBudget {
		wb := &v1alpha1.WatchBudget{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       v1alpha1.WatchBudgetSpec{Enforcement: v1alpha1.EnforcementDryRun, Limits: v1alpha1.Limits{WatchOpensPerMinute: ptr.To(opens), WatchBurst: ptr.To[int32](30)}},
		}
		if err := admin.Create(ctx, wb); err != nil {
			t.Fatal(err)
		}
		return wb
	}
	hookBudget(def, 60, nil)
	edited := hookBudget(agents, 600, nil)
	patch := client.MergeFrom(edited.DeepCopy())
	edited.Spec.Enforcement = v1alpha1.EnforcementEnforce
	if err := admin.Patch(ctx, edited, patch); err != nil {
		t.Fatal(err)
	}
	// Bootstrapped by this install earlier, no longer configured.
	goneWB := hookBudget(gone, 10, map[string]string{controllers.BootstrapLabel: install})
	patch = client.MergeFrom(goneWB.DeepCopy())
	goneWB.Annotations = map[string]string{controllers.AutoUpdateAnnotation: "true"}
	if err := admin.Patch(ctx, goneWB, patch); err != nil {
		t.Fatal(err)
	}
	// Another install's, auto-updated, not in this install's set.
	other := hookBudget(theirs, 10, map[string]string{controllers.BootstrapLabel: "boot-other"})
	patch = client.MergeFrom(other.DeepCopy())
	other.Annotations = map[string]string{controllers.AutoUpdateAnnotation: "true"}
	if err := admin.Patch(ctx, other, patch); err != nil {
		t.Fatal(err)
	}

	agentsWant := controllers.BootstrapBudget{Name: agents, Spec: map[string]any{"enforcement": "DryRun", "limits": map[string]any{"watchOpensPerMinute": int64(900), "watchBurst": int64(500)}}}
	startReplica(t, replicaOptions{Options: controllers.Options{PodName: "boot-b-0", Namespace: install, Bootstrap: bootstrapSet(install, 120, agentsWant)}})

	eventually(t, 10*time.Second, "the unedited hook budget is brought up to date", budgetIs(def, opensPerMinute(120)))
	eventually(t, 10*time.Second, "the edited hook budget is marked taken over", budgetIs(agents, func(wb *v1alpha1.WatchBudget) error {
		if wb.Annotations[controllers.AutoUpdateAnnotation] != "false" {
			return fmt.Errorf("annotations %v", wb.Annotations)
		}
		return nil
	}))
	if got := getBudget(t, agents); got.Spec.Enforcement != v1alpha1.EnforcementEnforce || ptr.Deref(got.Spec.Limits.WatchOpensPerMinute, 0) != 600 {
		t.Errorf("the edited hook budget changed: %s, %d opens/min", got.Spec.Enforcement, ptr.Deref(got.Spec.Limits.WatchOpensPerMinute, 0))
	}
	eventually(t, 10*time.Second, "the budget no longer configured is deleted", func() error {
		err := admin.Get(ctx, client.ObjectKey{Name: gone}, &v1alpha1.WatchBudget{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%w)", err)
	})
	if err := admin.Get(ctx, client.ObjectKey{Name: theirs}, &v1alpha1.WatchBudget{}); err != nil {
		t.Errorf("another install's budget: %v", err)
	}
}

func TestParseBootstrapBudgetsRejectsNonsense(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"a field the spec does not have":  {`[{"name":"a","spec":{"limit":{}}}]`, `unknown field "limit"`},
		"an Exempt budget without anyone": {`[{"name":"a","spec":{"enforcement":"Exempt"}}]`, "needs subjects"},
		"a name given twice":              {`[{"name":"a","spec":{}},{"name":"a","spec":{}}]`, "given twice"},
		"a name that is no DNS subdomain": {`[{"name":"A_b","spec":{}}]`, "name \"A_b\""},
		"a field the entry does not have": {`[{"name":"a","mandatry":true,"spec":{}}]`, `unknown field "mandatry"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := controllers.ParseBootstrapBudgets(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	got, err := controllers.ParseBootstrapBudgets(`[{"name":"x","mandatory":true,"spec":{"enforcement":"Exempt","subjects":[{"kind":"Group","name":"system:masters"}]}}]`)
	if err != nil || len(got) != 1 || !got[0].Mandatory {
		t.Errorf("a valid list: %+v, %v", got, err)
	}
}

// A chart's budget reads as the proxy enforces it, and one the proxy
// could not enforce says which budget and why.
func TestBootstrapBudgetAsEnforced(t *testing.T) {
	bs, err := controllers.ParseBootstrapBudgets(`[{"name":"x","spec":{"enforcement":"Enforce","limits":{"maxConcurrentWatches":7}}},` +
		`{"name":"y","spec":{"aggregate":{}}}]`)
	if err != nil || len(bs) != 2 {
		t.Fatalf("parsed %d budgets: %v", len(bs), err)
	}
	b, err := bs[0].Budget()
	if err != nil || b.Name != "x" || b.Enforcement != ratelimit.Enforce || b.Limits.MaxConcurrentWatches != 7 {
		t.Errorf("budget x: %+v, %v", b, err)
	}
	if _, err := bs[1].Budget(); err == nil || !strings.Contains(err.Error(), "budget y") || !strings.Contains(err.Error(), "aggregate") {
		t.Errorf("budget y: error %v, want one naming the budget and its aggregate", err)
	}
}

// TestTakingOverToEnforceKeepsTheObservation follows the first week: the
// bootstrapped catch-all runs DryRun and gathers a suggestion; the
// operator takes it over and switches it to Enforce with an edit. The
// budget is the same object, so its status (the suggestion, its since,
// the replica's entry) carries on, and a restart with the chart's values
// (a helm upgrade) leaves it Enforce.
func TestTakingOverToEnforceKeepsTheObservation(t *testing.T) {
	ctx := context.Background()
	const install = "boot-c"
	def := install + "-default"
	cleanupBudgets(t, install+"-exempt", def)
	set := bootstrapSet(install, 60)
	set[0].Spec["subjects"] = []any{map[string]any{"kind": "User", "name": "boot-c-*"}}
	opts := controllers.Options{PodName: "boot-c-0", Namespace: install, Bootstrap: set, CounterRefreshInterval: 100 * time.Millisecond}
	r := startReplica(t, replicaOptions{Options: opts})
	eventually(t, reloadDeadline, "the bootstrapped budget reaches the engine", func() error {
		_, err := policyBudget(r.engine, def)
		return err
	})
	for u := range 3 {
		d := r.engine.Decide(time.Now(), &ratelimit.Request{User: fmt.Sprintf("boot-c-%d", u), Verb: ratelimit.VerbWatch, Resource: "pods", ResourceVersion: "5"})
		if !d.Allowed || d.Budget != def {
			t.Fatalf("watch %d: %+v", u, d)
		}
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

	wb := getBudget(t, def)
	patch := client.MergeFrom(wb.DeepCopy())
	wb.Annotations[controllers.AutoUpdateAnnotation] = "false"
	wb.Spec.Enforcement = v1alpha1.EnforcementEnforce
	if err := admin.Patch(ctx, wb, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, reloadDeadline, "Enforce reaches the engine", func() error {
		b, err := policyBudget(r.engine, def)
		if err == nil && b.Enforcement != ratelimit.Enforce {
			err = fmt.Errorf("enforcement %s", b.Enforcement)
		}
		return err
	})
	d := r.engine.Decide(time.Now(), &ratelimit.Request{User: "boot-c-3", Verb: ratelimit.VerbWatch, Resource: "pods", ResourceVersion: "5"})
	if !d.Allowed {
		t.Fatalf("a 4th identity: %+v", d)
	}
	eventually(t, 10*time.Second, "the suggestion goes on from the same since", budgetIs(def, func(wb *v1alpha1.WatchBudget) error {
		s := wb.Status.Suggested
		if s == nil || s.Identities != 4 || s.Since == nil || !s.Since.Equal(&since) {
			return fmt.Errorf("suggested %+v, want 4 identities since %s", s, since)
		}
		return nil
	}))
	r.stop()
	// The mandatory budget, deleted while no leader runs, is reconciled
	// after the catch-all: once it is back, the catch-all was seen.
	if err := admin.Delete(ctx, getBudget(t, install+"-exempt")); err != nil {
		t.Fatal(err)
	}
	startReplica(t, replicaOptions{Options: controllers.Options{PodName: "boot-c-1", Namespace: install, Bootstrap: set}})
	eventually(t, 10*time.Second, "the restarted leader restored the mandatory budget", budgetIs(install+"-exempt", func(*v1alpha1.WatchBudget) error { return nil }))
	if got := getBudget(t, def); got.Spec.Enforcement != v1alpha1.EnforcementEnforce {
		t.Errorf("after a restart with the chart's values: %s, want Enforce", got.Spec.Enforcement)
	}
}
