package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/watchgate/watchgate/proxy"
)

// makeStale creates a pod template in namespace, churns others and returns
// the first one's resourceVersion once the API server declares it too old
// (asked directly, before any measurement through the proxy).
func makeStale(t *testing.T, namespace string) string {
	t.Helper()
	ctx := context.Background()
	cs := env.Clientset
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pt := func(name string) *corev1.PodTemplate {
		return &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: name}, Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}}
	}
	first, err := cs.CoreV1().PodTemplates(namespace).Create(ctx, pt("first"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if _, err := cs.CoreV1().PodTemplates(namespace).Create(ctx, pt(fmt.Sprintf("churn-%d", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rv := first.ResourceVersion
	eventually(t, 60*time.Second, "resourceVersion "+rv+" to be compacted", func() (bool, error) {
		w, err := cs.CoreV1().PodTemplates(namespace).Watch(ctx, metav1.ListOptions{ResourceVersion: rv, TimeoutSeconds: ptrTo(int64(1))})
		if err != nil {
			return false, err
		}
		defer w.Stop()
		ev, ok := <-w.ResultChan()
		return ok && isTooOld(ev), nil
	})
	return rv
}

func isTooOld(ev watch.Event) bool {
	s, ok := ev.Object.(*metav1.Status)
	return ev.Type == watch.Error && ok && s.Code == 410 && s.Reason == metav1.StatusReasonExpired
}

func ptrTo[T any](v T) *T { return &v }

// The seed story: clients re-subscribe at once, forever, with a version the
// API server declared too old. Through the proxy, that version reaches the
// API server once; every other attempt is answered locally, exactly as the
// API server would have answered, in JSON and in protobuf.
func TestStaleResubscriptionLoopReachesAPIServerOnce(t *testing.T) {
	ctx := context.Background()
	namespace := uniqueName("seed")
	sa := serviceAccount(t, namespace, "dashboard", readWatch("podtemplates"))
	rv := makeStale(t, namespace)
	p := startProxy(t, generous("everyone", 100))

	before, err := env.WatchRequests(ctx, "", "podtemplates")
	if err != nil {
		t.Fatal(err)
	}
	learnedBefore := proxyMetric(t, "watchgate_proxy_stale_versions_learned_total", nil)
	staleRejected := map[string]string{"verb": "watch", "decision": "reject", "reason": "StaleResourceVersion", "budget": "everyone"}
	rejectedBefore := proxyMetric(t, "watchgate_proxy_requests_total", staleRejected)

	resubscribe := func(protobuf bool) error {
		cs, err := kubernetes.NewForConfig(p.Config(sa.Token, protobuf))
		if err != nil {
			return err
		}
		w, err := cs.CoreV1().PodTemplates(namespace).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
		if err != nil {
			return err
		}
		defer w.Stop()
		ev, ok := <-w.ResultChan()
		if !ok || !isTooOld(ev) {
			return fmt.Errorf("protobuf=%v: want one ERROR 410 Expired event, got %v %#v", protobuf, ev.Type, ev.Object)
		}
		if msg := ev.Object.(*metav1.Status).Message; !strings.Contains(msg, "too old") {
			return fmt.Errorf("protobuf=%v: message %q does not say \"too old\"", protobuf, msg)
		}
		if _, open := <-w.ResultChan(); open {
			return fmt.Errorf("protobuf=%v: stream not closed after the ERROR event", protobuf)
		}
		return nil
	}

	// The first one teaches the proxy; then 20 tabs loop 5 times each.
	if err := resubscribe(false); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for tab := range 20 {
		wg.Go(func() {
			for range 5 {
				if err := resubscribe(tab%2 == 1); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// The API server counts a watch when it ends: wait for the first one,
	// then check nothing else came.
	var after float64
	eventually(t, 15*time.Second, "the first watch to be counted by the API server", func() (bool, error) {
		after, err = env.WatchRequests(ctx, "", "podtemplates")
		return after >= before+1, err
	})
	if after != before+1 {
		t.Errorf("API server saw %v WATCH requests for the stale version through the proxy, want 1 (101 attempts)", after-before)
	}
	if got := proxyMetric(t, "watchgate_proxy_stale_versions_learned_total", nil) - learnedBefore; got != 1 {
		t.Errorf("stale versions learned = %v, want 1", got)
	}
	rejected := proxyMetric(t, "watchgate_proxy_requests_total", staleRejected) - rejectedBefore
	if rejected < 100 {
		t.Errorf("stale watches answered locally = %v, want >= 100", rejected)
	}

	// On the wire: HTTP 200, the API server's JSON watch content type, one
	// ERROR line, the decision header.
	resp, body := rawGet(t, p, sa.Token, "/api/v1/namespaces/"+namespace+"/podtemplates?watch=true&resourceVersion="+rv, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("stale answer: HTTP %d, Content-Type %q; want 200 application/json", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if got, want := resp.Header.Get(proxy.DecisionHeader), "reject; reason=StaleResourceVersion; budget=everyone"; got != want {
		t.Errorf("%s = %q, want %q", proxy.DecisionHeader, got, want)
	}
	var event struct {
		Type   string        `json:"type"`
		Object metav1.Status `json:"object"`
	}
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &event) != nil || event.Type != "ERROR" ||
		event.Object.Kind != "Status" || event.Object.APIVersion != "v1" || event.Object.Code != 410 || event.Object.Reason != metav1.StatusReasonExpired {
		t.Errorf("stale answer body = %q, want one ERROR event with a v1 Status 410 Expired", body)
	}
}
