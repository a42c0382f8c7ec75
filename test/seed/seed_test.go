package seed

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchgate/watchgate/test/apiserver"
)

var env *apiserver.Env

func TestMain(m *testing.M) {
	apiserver.Main(m, &env, apiserver.Suite{Options: apiserver.Options{StaleVersions: true}})
}

// uniqueNamespace names a namespace no other run of a test in this process
// has used, so that tests can run repeatedly (-count) against one API server.
func uniqueNamespace(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, namespaces.Add(1))
}

var namespaces atomic.Int64

// staleItemVersion lists a fresh namespace's ConfigMaps after etcd compacted
// past its first item: it returns the item's (stale) resourceVersion and the
// list's (current) one, which is what the seed's dashboard confused.
func staleItemVersion(t *testing.T, ctx context.Context, ns string) (itemRV, listRV string) {
	t.Helper()
	itemRV, err := env.StaleVersion(ctx, ns, 100, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	list, err := env.Clientset.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) < 2 {
		t.Fatalf("listed %d ConfigMaps, want the first one and the churn", len(list.Items))
	}
	if list.ResourceVersion == itemRV {
		t.Fatalf("list resourceVersion %s equals the item's; the scenario needs them apart", itemRV)
	}
	return itemRV, list.ResourceVersion
}

func TestStaleItemVersionIsExpiredInsideA200Stream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := uniqueNamespace("seed-expired")
	itemRV, listRV := staleItemVersion(t, ctx, ns)
	path := "/api/v1/namespaces/" + ns + "/configmaps"

	// The item's version: HTTP 200, one ERROR event, 410 Expired, closed.
	got, err := apiserver.WatchFor(ctx, env.Config, path, itemRV, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got.HTTPStatus != http.StatusOK {
		t.Errorf("HTTP status = %d, want 200 (too old is not an HTTP 410)", got.HTTPStatus)
	}
	if !strings.HasPrefix(got.ContentType, "application/json") {
		t.Errorf("Content-Type = %q, want application/json", got.ContentType)
	}
	if len(got.Events) != 1 || got.Events[0].Type != "ERROR" {
		t.Fatalf("events = %+v, want exactly one ERROR event", got.Events)
	}
	st := got.Status
	if st.Kind != "Status" || st.Status != metav1.StatusFailure || st.Code != http.StatusGone || st.Reason != metav1.StatusReasonExpired {
		t.Errorf("status = %+v, want a Failure Status, code 410, reason Expired", st)
	}
	if !strings.Contains(st.Message, "too old") {
		t.Errorf("message = %q, want it to say \"too old\" (front-ends match that text)", st.Message)
	}
	if !got.Closed {
		t.Error("stream still open after the ERROR event, want the server to close it")
	}

	// The list's version: the watch stays open and delivers what happens next.
	watcher, err := env.Clientset.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: listRV})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Stop()
	created, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-list"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-watcher.ResultChan():
			if !ok {
				t.Fatal("watch from the list's resourceVersion closed, want it open")
			}
			if ev.Type == "ERROR" {
				t.Fatalf("watch from the list's resourceVersion got an error: %+v", ev.Object)
			}
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && cm.Name == created.Name && ev.Type == "ADDED" {
				return
			}
		case <-timeout:
			t.Fatal("no ADDED event for the new ConfigMap within 10s on the watch from the list's resourceVersion")
		}
	}
}

func TestEveryStaleResubscriptionReachesTheAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := uniqueNamespace("seed-loop")
	itemRV, _ := staleItemVersion(t, ctx, ns)
	path := "/api/v1/namespaces/" + ns + "/configmaps"

	before, err := env.WatchRequests(ctx, "", "configmaps")
	if err != nil {
		t.Fatal(err)
	}
	const resubscriptions = 30
	for i := range resubscriptions {
		got, err := apiserver.WatchFor(ctx, env.Config, path, itemRV, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got.HTTPStatus != http.StatusOK || got.Code != http.StatusGone {
			t.Fatalf("resubscription %d: HTTP %d, event code %d; want 200 with a 410 event", i, got.HTTPStatus, got.Code)
		}
	}
	after, err := env.WatchRequests(ctx, "", "configmaps")
	if err != nil {
		t.Fatal(err)
	}
	// Nothing upstream turns the loop away: API Priority and Fairness admits
	// every one. This is the flood watchgate stops.
	if reached := after - before; reached < resubscriptions {
		t.Errorf("apiserver_request_total{verb=WATCH,resource=configmaps} grew by %v, want >= %d (every stale resubscription reaches the API server)", reached, resubscriptions)
	} else {
		t.Logf("%d stale resubscriptions, %v WATCH requests counted by the API server", resubscriptions, reached)
	}
}
