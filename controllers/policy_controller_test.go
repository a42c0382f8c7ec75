package controllers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
)

// reloadDeadline is how soon a change of a WatchBudget must reach the
// engine.
const reloadDeadline = 2 * time.Second

func TestCreateUpdateDeleteReachTheEngine(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "lifecycle"}})

	wb := &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "lifecycle"},
		Spec: v1alpha1.WatchBudgetSpec{
			Precedence: 42,
			Subjects:   []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "lifecycle-*"}},
			Limits:     v1alpha1.Limits{WatchOpensPerMinute: ptr.To[int32](120), WatchBurst: ptr.To[int32](7)},
		},
	}
	createBudget(t, wb)
	eventually(t, reloadDeadline, "the created budget reaches the engine", func() error {
		b, err := policyBudget(r.engine, "lifecycle")
		if err != nil {
			return err
		}
		if b.Precedence != 42 || b.Limits.WatchOpensPerMinute != 120 || b.Limits.WatchBurst != 7 || b.Limits.ListBurst != 10 {
			return fmt.Errorf("engine has %+v", b)
		}
		return nil
	})
	if m := r.engine.Policy().Match("lifecycle-alice", nil, "", "pods", "default"); m == nil || m.Name != "lifecycle" {
		t.Errorf("Match(lifecycle-alice) = %v, want the lifecycle budget", m)
	}
	eventually(t, 5*time.Second, "Ready=True for generation 1", readyIs(wb.Name, metav1.ConditionTrue, v1alpha1.ReasonCompiled, 1))

	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"limits":{"watchBurst":9},"enforcement":"DryRun"}}`))
	if err := admin.Patch(ctx, wb, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, reloadDeadline, "the update reaches the engine", func() error {
		b, err := policyBudget(r.engine, "lifecycle")
		if err != nil {
			return err
		}
		if b.Limits.WatchBurst != 9 || b.Enforcement != ratelimit.DryRun {
			return fmt.Errorf("engine has %+v", b)
		}
		return nil
	})
	eventually(t, 5*time.Second, "Ready=True for generation 2", readyIs(wb.Name, metav1.ConditionTrue, v1alpha1.ReasonCompiled, 2))

	if err := admin.Delete(ctx, wb); err != nil {
		t.Fatal(err)
	}
	eventually(t, reloadDeadline, "the deletion reaches the engine", func() error {
		if _, err := policyBudget(r.engine, "lifecycle"); err == nil {
			return errors.New("still in the policy")
		}
		return nil
	})
}

// An edit that changes nothing about an identity's bucket must not refill
// it: a client that exhausted its burst stays throttled.
func TestUnrelatedEditKeepsAnExhaustedBucketExhausted(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "bucket"}})
	wb := &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "bucket"},
		Spec: v1alpha1.WatchBudgetSpec{
			Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "bucket-alice"}},
			// One token a minute: nothing refills during the test.
			Limits: v1alpha1.Limits{WatchOpensPerMinute: ptr.To[int32](1), WatchBurst: ptr.To[int32](2)},
		},
	}
	createBudget(t, wb)
	eventually(t, reloadDeadline, "the budget reaches the engine", func() error {
		_, err := policyBudget(r.engine, "bucket")
		return err
	})
	watch := &ratelimit.Request{User: "bucket-alice", Verb: ratelimit.VerbWatch, Resource: "configmaps", Namespace: "default", ResourceVersion: "100"}
	for i, want := range []ratelimit.Reason{ratelimit.ReasonNone, ratelimit.ReasonNone, ratelimit.ReasonRateLimited} {
		if d := r.engine.Decide(time.Now(), watch); d.Reason != want || d.Budget != "bucket" {
			t.Fatalf("watch %d before the edit: reason %q budget %q, want %q from bucket", i+1, d.Reason, d.Budget, want)
		}
	}

	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"backoff":{"maxDelaySeconds":120}}}`))
	if err := admin.Patch(ctx, wb, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, reloadDeadline, "the edit reaches the engine", func() error {
		b, err := policyBudget(r.engine, "bucket")
		if err != nil {
			return err
		}
		if b.Backoff.Max != 2*time.Minute {
			return fmt.Errorf("backoff.max = %s", b.Backoff.Max)
		}
		return nil
	})
	if d := r.engine.Decide(time.Now(), watch); d.Reason != ratelimit.ReasonRateLimited {
		t.Errorf("watch after the edit: reason %q, want RateLimited (the bucket was refilled by the edit)", d.Reason)
	}
	other := *watch
	other.User = "bucket-bob"
	if d := r.engine.Decide(time.Now(), &other); !d.Allowed || d.Reason != ratelimit.ReasonNone {
		t.Errorf("another identity's first watch: %+v, want allowed (buckets are per identity)", d)
	}
}

// A budget the CRD let through but the controllers reject (here: stored
// while the CRD lacked its CEL rules, as after a downgrade or a hand-edited
// CRD) is Ready=False with the reason, is left out of the policy, and does
// not disturb the others.
func TestInvalidBudgetIsNotReadyAndLeavesOthersAlone(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "invalid"}})
	good := &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "invalid-neighbour"},
		Spec:       v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "invalid-neighbour"}}},
	}
	createBudget(t, good)

	restore := loosenBackoffRules(t)
	bad := &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "invalid-backoff"},
		Spec: v1alpha1.WatchBudgetSpec{
			Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "invalid-user"}},
			Backoff:  v1alpha1.Backoff{InitialDelaySeconds: ptr.To[int32](30), MaxDelaySeconds: ptr.To[int32](5)},
		},
	}
	eventually(t, 10*time.Second, "the loosened CRD accepts the invalid budget", func() error {
		return admin.Create(ctx, bad.DeepCopy())
	})
	t.Cleanup(func() { _ = client.IgnoreNotFound(admin.Delete(context.Background(), bad)) })
	restore()

	eventually(t, 5*time.Second, "Ready=False, InvalidSpec", readyIs(bad.Name, metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec, 1))
	cond := meta.FindStatusCondition(getBudget(t, bad.Name).Status.Conditions, v1alpha1.ConditionReady)
	if want := "backoff.maxDelaySeconds: must be >= backoff.initialDelaySeconds (30s)"; !strings.Contains(cond.Message, want) {
		t.Errorf("Ready message = %q, want it to contain %q", cond.Message, want)
	}
	eventually(t, 5*time.Second, "the neighbour is Ready", readyIs(good.Name, metav1.ConditionTrue, v1alpha1.ReasonCompiled, 1))
	eventually(t, reloadDeadline, "the neighbour is in the policy", func() error {
		_, err := policyBudget(r.engine, good.Name)
		return err
	})
	if _, err := policyBudget(r.engine, bad.Name); err == nil {
		t.Error("the invalid budget is in the engine's policy")
	}

	// Fixing it makes it Ready and enforced.
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"backoff":{"maxDelaySeconds":60}}}`))
	if err := admin.Patch(ctx, bad, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "Ready=True once fixed", readyIs(bad.Name, metav1.ConditionTrue, v1alpha1.ReasonCompiled, 2))
	eventually(t, reloadDeadline, "the fixed budget is in the policy", func() error {
		_, err := policyBudget(r.engine, bad.Name)
		return err
	})
}

// loosenBackoffRules removes the CEL rules on spec.backoff from the CRD and
// returns a function that puts them back (also run at cleanup).
func loosenBackoffRules(t *testing.T) (restore func()) {
	t.Helper()
	ctx := context.Background()
	const path = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/backoff/x-kubernetes-validations"
	var crd apiextensionsv1.CustomResourceDefinition
	if err := admin.Get(ctx, client.ObjectKey{Name: "watchbudgets.watchgate.io"}, &crd); err != nil {
		t.Fatal(err)
	}
	rules := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["backoff"].XValidations
	if len(rules) == 0 {
		t.Fatal("the CRD has no CEL rules on spec.backoff")
	}
	remove, _ := json.Marshal([]map[string]any{{"op": "remove", "path": path}})
	if err := admin.Patch(ctx, &crd, client.RawPatch(types.JSONPatchType, remove)); err != nil {
		t.Fatal(err)
	}
	done := false
	restore = func() {
		if done {
			return
		}
		done = true
		add, _ := json.Marshal([]map[string]any{{"op": "add", "path": path, "value": rules}})
		var crd apiextensionsv1.CustomResourceDefinition
		crd.Name = "watchbudgets.watchgate.io"
		if err := admin.Patch(context.Background(), &crd, client.RawPatch(types.JSONPatchType, add)); err != nil {
			t.Errorf("restore the CRD: %v", err)
		}
	}
	t.Cleanup(restore)
	return restore
}

// readyIs checks a budget's Ready condition.
func readyIs(name string, status metav1.ConditionStatus, reason string, generation int64) func() error {
	return func() error {
		var wb v1alpha1.WatchBudget
		if err := admin.Get(context.Background(), client.ObjectKey{Name: name}, &wb); err != nil {
			return err
		}
		c := meta.FindStatusCondition(wb.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil {
			return errors.New("no Ready condition")
		}
		if c.Status != status || c.Reason != reason || c.ObservedGeneration != generation || wb.Generation != generation {
			return fmt.Errorf("Ready = %s/%s for generation %d (object at %d): %s", c.Status, c.Reason, c.ObservedGeneration, wb.Generation, c.Message)
		}
		return nil
	}
}

// TestOpenWatchesCountAcrossDeleteAndRecreate: a user holding 3 watches
// under a cap of 3 still has them counted after the budget is deleted and
// created again, as kubectl (or an old chart's upgrade hook) does: the 4th
// is refused.
func TestOpenWatchesCountAcrossDeleteAndRecreate(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "recreate-0"}})
	newBudget := func() *v1alpha1.WatchBudget {
		return &v1alpha1.WatchBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "recreated"},
			Spec: v1alpha1.WatchBudgetSpec{
				Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "recreate-alice"}},
				Limits:   v1alpha1.Limits{MaxConcurrentWatches: ptr.To[int32](3)},
			},
		}
	}
	inPolicy := func(want bool) func() error {
		return func() error {
			_, err := policyBudget(r.engine, "recreated")
			if (err == nil) != want {
				return fmt.Errorf("in the policy: %v, want %v", err == nil, want)
			}
			return nil
		}
	}
	watch := func() ratelimit.Decision {
		return r.engine.Decide(time.Now(), &ratelimit.Request{User: "recreate-alice", Verb: ratelimit.VerbWatch, Resource: "pods", ResourceVersion: "1"})
	}
	createBudget(t, newBudget())
	eventually(t, reloadDeadline, "the budget reaches the engine", inPolicy(true))
	for i := range 3 {
		if d := watch(); !d.Allowed || d.Reason != "" {
			t.Fatalf("watch %d: %+v", i, d)
		}
	}
	if err := admin.Delete(ctx, newBudget()); err != nil {
		t.Fatal(err)
	}
	eventually(t, reloadDeadline, "the deletion reaches the engine", inPolicy(false))
	createBudget(t, newBudget())
	eventually(t, reloadDeadline, "the re-created budget reaches the engine", inPolicy(true))
	if d := watch(); d.Allowed || d.Reason != ratelimit.ReasonTooManyWatches {
		t.Errorf("the 4th watch after re-creation: allowed=%v reason=%q, want TooManyWatches", d.Allowed, d.Reason)
	}
	if got := r.engine.Stats()["recreated"].ActiveWatches; got != 3 {
		t.Errorf("ActiveWatches = %d, want 3", got)
	}
}
