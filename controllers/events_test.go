package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
)

// A storm of rejected requests from one identity becomes one Event on the
// budget, not one per request.
func TestThrottlingBecomesOneEventPerIdentity(t *testing.T) {
	r := startReplica(t, replicaOptions{
		Options: controllers.Options{PodName: "events"},
		events:  true,
		engine:  ratelimit.Options{ThrottleNotifyInterval: time.Hour},
	})
	wb := &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "events"},
		Spec: v1alpha1.WatchBudgetSpec{
			Subjects: []v1alpha1.Subject{
				{Kind: v1alpha1.SubjectKindUser, Name: "events-*"},
				{Kind: v1alpha1.SubjectKindServiceAccount, Namespace: "events", Name: "bob"},
			},
			Limits: v1alpha1.Limits{WatchOpensPerMinute: ptr.To[int32](1), WatchBurst: ptr.To[int32](1)},
		},
	}
	createBudget(t, wb)
	eventually(t, reloadDeadline, "the budget reaches the engine", func() error {
		_, err := policyBudget(r.engine, "events")
		return err
	})
	watch := func(user string) *ratelimit.Request {
		return &ratelimit.Request{User: user, Verb: ratelimit.VerbWatch, Resource: "pods", ResourceVersion: "3"}
	}
	const bob = "system:serviceaccount:events:bob"
	rejected := 0
	for range 50 {
		if d := r.engine.Decide(time.Now(), watch("events-alice")); d.Reason == ratelimit.ReasonRateLimited {
			rejected++
		}
	}
	if rejected != 49 {
		t.Fatalf("%d of alice's 50 watches were rate limited, want 49", rejected)
	}
	// bob's event is recorded after alice's: once it is there, so would any
	// duplicate of alice's be (the events API may then fold it into alice's
	// Event as a series, which is checked too).
	for range 2 {
		r.engine.Decide(time.Now(), watch(bob))
	}
	var events []eventsv1.Event
	eventually(t, 10*time.Second, "bob's event", func() error {
		var list eventsv1.EventList
		if err := admin.List(context.Background(), &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return err
		}
		events = events[:0]
		for _, e := range list.Items {
			// Only this budget's: an earlier run (-count) left Events
			// about a budget of the same name.
			if e.Regarding.Kind == "WatchBudget" && e.Regarding.UID == wb.UID {
				events = append(events, e)
			}
		}
		for _, e := range events {
			if strings.Contains(e.Note, `"`+bob+`"`) {
				if r := e.Related; r == nil || r.Kind != "ServiceAccount" || r.Namespace != "events" || r.Name != "bob" {
					return fmt.Errorf("bob's event's related object = %+v, want the ServiceAccount events/bob", r)
				}
				return nil
			}
		}
		return fmt.Errorf("%d events so far", len(events))
	})
	var alices []eventsv1.Event
	for _, e := range events {
		if strings.Contains(e.Note, `"events-alice"`) {
			alices = append(alices, e)
		}
	}
	if len(alices) != 1 {
		t.Fatalf("%d events for alice's 49 rejections, want 1: %+v", len(alices), alices)
	}
	e := alices[0]
	if e.Type != "Warning" || e.Reason != "RateLimited" || e.Action != "Reject" || e.ReportingController != "watchgate" || e.Series != nil {
		t.Errorf("event = type %q reason %q action %q controller %q series %v", e.Type, e.Reason, e.Action, e.ReportingController, e.Series)
	}
	if e.Regarding.APIVersion != v1alpha1.GroupVersion.String() || e.Regarding.UID == "" {
		t.Errorf("event regards %+v, want the WatchBudget with its UID", e.Regarding)
	}
	if e.Related == nil || e.Related.Kind != "User" || e.Related.Name != "events-alice" {
		t.Errorf("event's related object = %+v, want the User events-alice", e.Related)
	}
}
