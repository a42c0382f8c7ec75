package controllers

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/ratelimit"
)

func TestReadinessWaitsForTheFirstPolicy(t *testing.T) {
	engine := ratelimit.NewEngine(ratelimit.Options{})
	r := &PolicyReconciler{Reader: noBudgets{}, Engine: engine, Clock: clock.RealClock{}}
	if err := r.Check(nil); err == nil {
		t.Error("ready before any policy was loaded")
	}
	if r.Generations() != nil {
		t.Error("generations before any policy was loaded")
	}
	if _, err := r.Reconcile(context.Background(), policyKey); err != nil {
		t.Fatal(err)
	}
	if err := r.Check(nil); err != nil {
		t.Errorf("not ready after loading an empty policy: %v", err)
	}
}

func TestIdentityRef(t *testing.T) {
	for user, want := range map[string]string{
		"alice":                               "rbac.authorization.k8s.io/v1 User /alice",
		"system:serviceaccount:cattle:agent":  "v1 ServiceAccount cattle/agent",
		"system:serviceaccount:no-name-colon": "rbac.authorization.k8s.io/v1 User /system:serviceaccount:no-name-colon",
	} {
		r := identityRef(user)
		if got := r.APIVersion + " " + r.Kind + " " + r.Namespace + "/" + r.Name; got != want {
			t.Errorf("identityRef(%q) = %q, want %q", user, got, want)
		}
	}
}

// noBudgets is a client.Reader of an empty cluster.
type noBudgets struct{}

func (noBudgets) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return apierrors.NewNotFound(schema.GroupResource{}, "")
}

func (noBudgets) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }
