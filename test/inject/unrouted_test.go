package inject

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/watchgate/watchgate/inject"
)

// TestUnroutedPodsGetAnEvent: pods of a labelled namespace admitted while
// the webhook does not answer (failurePolicy Ignore) get a Warning Event
// NotRouted from the injector and are counted: one created before the
// injector started (found in the list it starts with), one created while
// it runs without its webhook (seen by its watch). A routed pod gets none.
func TestUnroutedPodsGetAnEvent(t *testing.T) {
	ctx := context.Background()
	ns := uniqueName("unrouted")
	namespace(t, ns, map[string]string{inject.LabelInject: inject.ValueEnabled}, "agent")
	before := createPod(t, ns, simplePod("before", "agent"))
	counted := unroutedTotal(t)

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, newPKI(t).caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	startInjector(t, inject.Target{Host: "watchgate.watchgate-system.svc", Port: 443}, caFile, func(o *inject.Options) { o.WebhookServer = nil })
	got := map[string]bool{}
	seen := func(name string) func() (bool, error) {
		return func() (bool, error) {
			evs, err := env.Clientset.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, e := range evs.Items {
				if e.Reason == inject.ReasonNotRouted && e.Regarding.Kind == "Pod" {
					got[e.Regarding.Name] = true
				}
			}
			return got[name], nil
		}
	}
	eventually(t, 30*time.Second, "a NotRouted Event on the pod created before the injector started", seen(before.Name))
	after := createPod(t, ns, simplePod("after", "agent"))
	routed := simplePod("routed", "agent")
	routed.Annotations = map[string]string{inject.AnnotationStatus: inject.StatusInjected}
	createPod(t, ns, routed)
	eventually(t, 30*time.Second, "a NotRouted Event on the pod created while it runs", seen(after.Name))
	if got[routed.Name] {
		t.Errorf("the routed pod got a %s Event", inject.ReasonNotRouted)
	}
	// At least: the list it starts with finds earlier tests' unrouted pods too.
	if n := unroutedTotal(t) - counted; n < 2 {
		t.Errorf("watchgate_inject_unrouted_pods_total grew by %v, want at least 2", n)
	}
}

// unroutedTotal reads watchgate_inject_unrouted_pods_total from the
// process's registry.
func unroutedTotal(t *testing.T) float64 {
	t.Helper()
	fams, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "watchgate_inject_unrouted_pods_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
