package controllers_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
)

// With leader election on, a replica that does not lead still enforces the
// current budgets and reports its own figures; only the leader writes the
// Ready condition and the sums.
func TestFollowerEnforcesAndReports(t *testing.T) {
	ctx := context.Background()
	const ns = "watchgate-leader"
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	leader := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "leader"}, leaseNamespace: ns})
	select {
	case <-leader.elected:
	case <-time.After(30 * time.Second):
		t.Fatal("the first replica was not elected")
	}
	follower := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "follower"}, leaseNamespace: ns})

	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "leader"},
		Spec:       v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "leader-*"}}},
	})
	eventually(t, reloadDeadline, "the budget reaches the follower's engine", func() error {
		_, err := policyBudget(follower.engine, "leader")
		return err
	})
	eventually(t, 5*time.Second, "both replicas' entries", statusIs("leader", map[string]entry{"leader": {}, "follower": {}}, 0, 0))
	eventually(t, 5*time.Second, "Ready from the leader", readyIs("leader", metav1.ConditionTrue, v1alpha1.ReasonCompiled, 1))
	select {
	case <-follower.elected:
		t.Error("the follower was elected while the leader runs")
	default:
	}
	for _, f := range getBudget(t, "leader").ManagedFields {
		if f.Manager == "watchgate-controller" && f.Subresource == "status" {
			return
		}
	}
	t.Error("no status fields managed by watchgate-controller")
}
