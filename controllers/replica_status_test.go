package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
)

// Two replicas write their own entries concurrently; neither loses the
// other's, the sums add both up, and a replica that stops takes its entry
// with it.
func TestTwoReplicasWriteTheirOwnEntries(t *testing.T) {
	a := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "replica-a"}})
	b := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "replica-b"}})
	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "two-replicas"},
		Spec: v1alpha1.WatchBudgetSpec{
			Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "two-replicas-*"}},
			Limits:   v1alpha1.Limits{WatchOpensPerMinute: ptr.To[int32](1), WatchBurst: ptr.To[int32](1)},
		},
	})
	for _, r := range []*replica{a, b} {
		eventually(t, reloadDeadline, "the budget reaches both engines", func() error {
			_, err := policyBudget(r.engine, "two-replicas")
			return err
		})
	}
	watch := func(user string) *ratelimit.Request {
		return &ratelimit.Request{User: user, Verb: ratelimit.VerbWatch, Resource: "pods", Namespace: "default", ResourceVersion: "5"}
	}
	now := time.Now()
	if d := a.engine.Decide(now, watch("two-replicas-alice")); !d.Allowed || !d.Watch.Valid() {
		t.Fatalf("alice's first watch on a: %+v", d)
	}
	if d := a.engine.Decide(now, watch("two-replicas-alice")); d.Reason != ratelimit.ReasonRateLimited {
		t.Fatalf("alice's second watch on a: %+v, want RateLimited", d)
	}
	bobs := b.engine.Decide(now, watch("two-replicas-bob"))
	if !bobs.Allowed || !bobs.Watch.Valid() {
		t.Fatalf("bob's watch on b: %+v", bobs)
	}

	wantA := entry{active: 1, identities: 1, decisions: map[string]int64{"Allowed": 1, "RateLimited": 1}, recent: 1, offenders: []v1alpha1.Offender{{User: "two-replicas-alice", Rejections: 1}}}
	eventually(t, 5*time.Second, "both entries and their sums", statusIs("two-replicas", map[string]entry{
		"replica-a": wantA,
		"replica-b": {active: 1, identities: 1, decisions: map[string]int64{"Allowed": 1}},
	}, 2, 1))

	// b's figures change; a's entry is untouched.
	b.engine.WatchEnded(time.Now(), bobs.Watch, time.Hour, ratelimit.OutcomeClosed)
	eventually(t, 5*time.Second, "b's new figures beside a's", statusIs("two-replicas", map[string]entry{
		"replica-a": wantA,
		"replica-b": {active: 0, identities: 1, decisions: map[string]int64{"Allowed": 1}},
	}, 1, 1))

	// b stops cleanly: its entry goes, a's stays.
	b.stop()
	eventually(t, 5*time.Second, "only a's entry once b stopped", statusIs("two-replicas", map[string]entry{"replica-a": wantA}, 1, 1))
}

// The leader prunes entries of pods that no longer exist, and only those.
func TestPrunerRemovesEntriesOfGonePods(t *testing.T) {
	ctx := context.Background()
	const ns = "watchgate-prune"
	if _, err := env.ServiceAccount(ctx, ns, "default"); err != nil { // creates the namespace too
		t.Fatal(err)
	}
	createPod(t, ns, "replica-live")

	startReplica(t, replicaOptions{Options: controllers.Options{PodName: "replica-live", Namespace: ns, PruneInterval: 100 * time.Millisecond}})
	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "prune"},
		Spec:       v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "prune-*"}}},
	})
	live := entry{}
	eventually(t, 5*time.Second, "the live replica's entry", statusIs("prune", map[string]entry{"replica-live": live}, 0, 0))

	// A replica that crashed left its entry behind, under its own field
	// manager, as it would have written it.
	ghost := map[string]any{"pod": "replica-ghost", "activeWatches": int64(7), "lastUpdateTime": time.Now().UTC().Format(time.RFC3339)}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "WatchBudget",
		"metadata": map[string]any{"name": "prune"},
		"status":   map[string]any{"replicas": []any{ghost}},
	}}
	if err := admin.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("watchgate-replica-replica-ghost"), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the ghost's entry pruned, the live one kept", statusIs("prune", map[string]entry{"replica-live": live}, 0, 0))
}

// A replica that is not a pod in the namespace it was given (a process
// outside the cluster run with --pod-namespace by hand) prunes nothing: the
// entries of other replicas' pods, wherever they run, and its own stay. Once
// its own pod is there, it prunes the entries of pods that are not.
func TestPrunerPrunesOnlyFromItsOwnPodsNamespace(t *testing.T) {
	ctx := context.Background()
	const ns = "watchgate-prune-outside"
	if _, err := env.ServiceAccount(ctx, ns, "default"); err != nil { // creates the namespace too
		t.Fatal(err)
	}
	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "prune-outside"},
		Spec:       v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "prune-outside-*"}}},
	})
	for _, pod := range []string{"laptop", "replica-elsewhere"} {
		e := map[string]any{"pod": pod, "activeWatches": int64(1), "lastUpdateTime": time.Now().UTC().Format(time.RFC3339)}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "WatchBudget",
			"metadata": map[string]any{"name": "prune-outside"},
			"status":   map[string]any{"replicas": []any{e}},
		}}
		if err := admin.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("watchgate-replica-"+pod), client.ForceOwnership); err != nil {
			t.Fatal(err)
		}
	}
	pods := func() []string {
		var got []string
		for _, r := range getBudget(t, "prune-outside").Status.Replicas {
			got = append(got, r.Pod)
		}
		slices.Sort(got)
		return got
	}
	p := &controllers.ReplicaPruner{Client: admin, Reader: admin, PodReader: admin, Namespace: ns, Pod: "laptop"}
	if err := p.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := pods(), []string{"laptop", "replica-elsewhere"}; !slices.Equal(got, want) {
		t.Errorf("entries after pruning from outside the namespace: %q, want %q", got, want)
	}

	createPod(t, ns, "laptop")
	if err := p.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := pods(), []string{"laptop"}; !slices.Equal(got, want) {
		t.Errorf("entries after pruning as a pod of the namespace: %q, want %q", got, want)
	}
}

// Two installs in different namespaces share the CRD: each writes its
// namespace in its entries, and a leader prunes only the entries of its
// own namespace (and those that name none), never the other install's.
func TestPrunerLeavesAnotherInstallsEntries(t *testing.T) {
	ctx := context.Background()
	const mine, theirs = "watchgate-side-a", "watchgate-side-b"
	for _, ns := range []string{mine, theirs} {
		if _, err := env.ServiceAccount(ctx, ns, "default"); err != nil { // creates the namespace too
			t.Fatal(err)
		}
	}
	createPod(t, mine, "side-a-0")
	createPod(t, theirs, "side-b-0")
	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "side-by-side"},
		Spec:       v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "side-*"}}},
	})
	// Install b's replica writes its entry, with its namespace.
	startReplica(t, replicaOptions{Options: controllers.Options{PodName: "side-b-0", Namespace: theirs, PruneInterval: time.Hour}})
	eventually(t, 5*time.Second, "install b's entry names its namespace", func() error {
		for _, r := range getBudget(t, "side-by-side").Status.Replicas {
			if r.Pod == "side-b-0" && r.Namespace == theirs {
				return nil
			}
		}
		return fmt.Errorf("entries %+v", getBudget(t, "side-by-side").Status.Replicas)
	})
	// A crashed replica of install a left an entry without a namespace.
	ghost := map[string]any{"pod": "side-a-ghost", "activeWatches": int64(1), "lastUpdateTime": time.Now().UTC().Format(time.RFC3339)}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "WatchBudget",
		"metadata": map[string]any{"name": "side-by-side"},
		"status":   map[string]any{"replicas": []any{ghost}},
	}}
	if err := admin.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("watchgate-replica-side-a-ghost"), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	p := &controllers.ReplicaPruner{Client: admin, Reader: admin, PodReader: admin, Namespace: mine, Pod: "side-a-0"}
	eventually(t, 5*time.Second, "install a's leader prunes its ghost and keeps b's entry", func() error {
		if err := p.Prune(ctx); err != nil {
			return err
		}
		var pods []string
		for _, r := range getBudget(t, "side-by-side").Status.Replicas {
			pods = append(pods, r.Pod)
		}
		if !slices.Equal(pods, []string{"side-b-0"}) {
			return fmt.Errorf("entries %q, want only side-b-0", pods)
		}
		return nil
	})
}

// createPod creates a replica's pod (no kubelet runs it) in ns, deleted at
// cleanup.
func createPod(t *testing.T, ns, name string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "watchgate", Image: "watchgate:test"}},
		},
	}
	if err := admin.Create(context.Background(), pod); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
}

// entry is what a test expects of a replica's status entry.
type entry struct {
	active, identities, recent int64
	decisions                  map[string]int64
	offenders                  []v1alpha1.Offender
}

// statusIs checks a budget's replica entries (exactly these pods) and sums.
func statusIs(name string, want map[string]entry, active, recent int64) func() error {
	return func() error {
		var wb v1alpha1.WatchBudget
		if err := admin.Get(context.Background(), client.ObjectKey{Name: name}, &wb); err != nil {
			return err
		}
		st := wb.Status
		if len(st.Replicas) != len(want) {
			return fmt.Errorf("%d entries, want %d: %+v", len(st.Replicas), len(want), st.Replicas)
		}
		for _, r := range st.Replicas {
			w, ok := want[r.Pod]
			if !ok {
				return fmt.Errorf("unexpected entry %+v", r)
			}
			got := entry{active: r.ActiveWatches, identities: r.TrackedIdentities, recent: r.RecentRejections, decisions: r.Decisions, offenders: r.TopOffenders}
			if fmt.Sprint(got) != fmt.Sprint(w) {
				return fmt.Errorf("entry of %s = %+v, want %+v", r.Pod, got, w)
			}
			if r.ObservedGeneration != wb.Generation || r.LastUpdateTime.IsZero() {
				return fmt.Errorf("entry of %s: observedGeneration %d (object at %d), lastUpdateTime %v", r.Pod, r.ObservedGeneration, wb.Generation, r.LastUpdateTime)
			}
		}
		if st.ActiveWatches != active || st.RecentRejections != recent {
			return fmt.Errorf("sums = %d active, %d recent rejections; want %d, %d", st.ActiveWatches, st.RecentRejections, active, recent)
		}
		return nil
	}
}

// A budget that is busy but steady — its identity keeps being admitted and
// nothing else changes — costs the API server no writes: the cumulative
// counts alone wait for the counter refresh (an hour here). A change of
// anything else is written at the next tick, with the counts of that
// moment. Writes are counted by the budget's resourceVersion.
func TestBusyButSteadyBudgetIsNotRewritten(t *testing.T) {
	r := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "steady", CounterRefreshInterval: time.Hour}})
	name := fmt.Sprintf("steady-%d", time.Now().UnixNano())
	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "steady-*"}}},
	})
	eventually(t, reloadDeadline, "the budget reaches the engine", func() error {
		_, err := policyBudget(r.engine, name)
		return err
	})
	// Lists are admitted and counted, and change no other figure.
	list := &ratelimit.Request{User: "steady-alice", Verb: ratelimit.VerbList, Resource: "pods", Namespace: "default"}
	r.engine.Decide(time.Now(), list)
	eventually(t, 5*time.Second, "the first entry", statusIs(name, map[string]entry{
		"steady": {identities: 1, decisions: map[string]int64{"Allowed": 1}},
	}, 0, 0))
	// Let the writer's cache catch up with its own write (until then it
	// may write the same entry once more).
	rv := ""
	eventually(t, 10*time.Second, "the budget's resourceVersion settles", func() error {
		before := getBudget(t, name).ResourceVersion
		time.Sleep(500 * time.Millisecond)
		if rv = getBudget(t, name).ResourceVersion; rv != before {
			return fmt.Errorf("written again: %s → %s", before, rv)
		}
		return nil
	})

	// 30 ticks of the writer (100 ms each) with 10 admitted lists each.
	for range 30 {
		for range 10 {
			if d := r.engine.Decide(time.Now(), list); !d.Allowed {
				t.Fatalf("list: %+v", d)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := getBudget(t, name).ResourceVersion; got != rv {
		t.Errorf("the budget was written (resourceVersion %s → %s) while only its cumulative counts changed", rv, got)
	}

	// A watch opens: written at once, with the counts as they are now.
	w := r.engine.Decide(time.Now(), &ratelimit.Request{User: "steady-alice", Verb: ratelimit.VerbWatch, Resource: "pods", Namespace: "default", ResourceVersion: "7"})
	if !w.Allowed {
		t.Fatalf("watch: %+v", w)
	}
	defer r.engine.WatchEnded(time.Now(), w.Watch, time.Hour, ratelimit.OutcomeClosed)
	eventually(t, 5*time.Second, "the new figures with the counts of the moment", statusIs(name, map[string]entry{
		"steady": {active: 1, identities: 1, decisions: map[string]int64{"Allowed": 302}},
	}, 1, 0))
}
