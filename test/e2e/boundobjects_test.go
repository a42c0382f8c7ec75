package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/proxy"
)

// podToken creates a pod object (no kubelet runs it) of sa and returns it
// and a token bound to it.
func podToken(t *testing.T, namespace, sa, name string) (*corev1.Pod, string) {
	t.Helper()
	ctx := context.Background()
	pod, err := env.Clientset.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "agent", Image: "agent"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := env.Clientset.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod, tr.Status.Token
}

// With default options, a token whose pod was deleted is refused by
// watchgate before the API server refuses it: every request watchgate
// lets through reaches the API server, and the first 401 is watchgate's
// own (no decision: not charged, not forwarded). Then the watches
// watchgate answers itself, which never reach the API server (a stale
// version answered locally), are refused too.
func TestTokenOfADeletedPodIsRefusedNoLaterThanByTheAPIServer(t *testing.T) {
	ctx := context.Background()
	ns := uniqueName("revoked")
	sa := serviceAccount(t, ns, "agent", readWatch("pods", "podtemplates"))
	pod, token := podToken(t, ns, sa.Name, "agent-0")
	rv := makeStale(t, ns)
	p := startProxy(t, generous("everyone", 10))
	c := p.clientFrom("127.0.0.1")
	stale := "/api/v1/namespaces/" + ns + "/podtemplates?watch=true&resourceVersion=" + rv
	list := "/api/v1/namespaces/" + ns + "/pods"
	for i := range 2 { // the first teaches watchgate the version is stale
		if code, decision, err := send(c, p.URL, token, stale); err != nil || code != http.StatusOK {
			t.Fatalf("stale watch %d with the pod: HTTP %d %q %v, want 200", i, code, decision, err)
		}
	}
	if code, decision, _ := send(c, p.URL, token, stale); decision != "reject; reason=StaleResourceVersion; budget=everyone" {
		t.Fatalf("stale watch: HTTP %d %q, want it answered locally", code, decision)
	}

	if err := env.Clientset.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	for {
		code, decision, err := send(c, p.URL, token, list)
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusUnauthorized {
			if decision != "" {
				t.Fatalf("the API server refused the token of the deleted pod %v after the deletion, and watchgate had not: its 401 carries decision %q",
					time.Since(deleted).Round(time.Millisecond), decision)
			}
			t.Logf("watchgate refused the token %v after the deletion", time.Since(deleted).Round(time.Millisecond))
			break
		}
		if time.Since(deleted) > 40*time.Second {
			t.Fatalf("the token of the deleted pod still served 40s after the deletion: HTTP %d %q", code, decision)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, decision, err := send(c, p.URL, token, stale); err != nil || code != http.StatusUnauthorized || decision != "" {
		t.Errorf("a stale watch with the token of the deleted pod: HTTP %d %q %v, want 401 from watchgate", code, decision, err)
	}
}

// The lookups of the objects tokens are bound to are bounded per client
// network, as TokenReviews are: tokens of 30 deleted pods sent from one
// /24 cost at most its burst of pod GETs (then they are reviewed, within
// the network's bucket of TokenReviews), and a valid bound token from
// another /24 is still served.
func TestBoundObjectLookupsArePerNetwork(t *testing.T) {
	ctx := context.Background()
	ns := uniqueName("lookups")
	sa := serviceAccount(t, ns, "agent", readWatch("pods"))
	_, valid := podToken(t, ns, sa.Name, "valid")
	tokens := make([]string, 30)
	for i := range tokens {
		var pod *corev1.Pod
		pod, tokens[i] = podToken(t, ns, sa.Name, fmt.Sprintf("gone-%d", i))
		if err := env.Clientset.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	}
	p := startProxyWith(t, func(o *proxy.Options) {
		o.TokenReviewsPerClientPerSecond, o.TokenReviewClientBurst = 0.001, 5
	}, generous("everyone", 10))
	path := "/api/v1/namespaces/" + ns + "/pods"
	before := apiServerRequests(t, "pods", "GET")
	c := p.clientFrom("127.0.0.2")
	for _, token := range tokens {
		if code, _, err := send(c, p.URL, token, path); err != nil || code == http.StatusOK {
			t.Errorf("a token of a deleted pod: HTTP %d %v, want refused", code, err)
		}
	}
	// The API server looks the pod up itself for each TokenReview: at most
	// the network's 5 reviews.
	if n := apiServerRequests(t, "pods", "GET") - before; n > 10 {
		t.Errorf("%v pod GETs for 30 tokens of deleted pods from one /24, want at most 10: its burst 5 and those of its 5 TokenReviews", n)
	}
	if code, _, err := send(p.clientFrom("127.0.1.2"), p.URL, valid, path); err != nil || code != http.StatusOK {
		t.Errorf("a valid bound token from another /24: HTTP %d %v, want 200", code, err)
	}
}

// foundTTL is how long watchgate trusts an object found by a GET
// (authn.MaxFoundTTL) when no watch tells it of the object's deletion.
const foundTTL = 10 * time.Second

// A token whose pod, node or service account is deleted is refused by
// watchgate as soon as the deletion reaches its watch of those objects, not
// when its answer for the object expires: each token is first used at t0
// for a stale-version watch watchgate answers itself (so watchgate looked
// its objects up after t0 and, with only the GET to go by, would trust them
// until t0 + MaxFoundTTL); the object is deleted, and the same watch,
// which never reaches the API server, is refused before t0 + MaxFoundTTL,
// the deletion counted as seen by the watch.
func TestTokenOfADeletedObjectIsRefusedOnceTheDeletionIsWatched(t *testing.T) {
	ctx := context.Background()
	ns := uniqueName("watched")
	teacher := serviceAccount(t, ns, "teacher", readWatch("podtemplates"))
	rv := makeStale(t, ns)
	p := startProxy(t, generous("everyone", 10))
	c := p.clientFrom("127.0.0.3")
	stale := "/api/v1/namespaces/" + ns + "/podtemplates?watch=true&resourceVersion=" + rv
	for i := range 2 { // the first teaches watchgate the version is stale
		if code, decision, err := send(c, p.URL, teacher.Token, stale); err != nil || code != http.StatusOK {
			t.Fatalf("stale watch %d: HTTP %d %q %v, want 200", i, code, decision, err)
		}
	}

	for name, tc := range map[string]func(t *testing.T) (token, resource string, deleteIt func() error){
		"its pod": func(t *testing.T) (string, string, func() error) {
			sa := serviceAccount(t, ns, "pod-agent")
			pod, token := podToken(t, ns, sa.Name, "agent-0")
			return token, "pods", func() error {
				return env.Clientset.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			}
		},
		"its node": func(t *testing.T) (string, string, func() error) {
			sa := serviceAccount(t, ns, "node-agent")
			node, token := nodeToken(t, ns, sa.Name, uniqueName("node"))
			return token, "nodes", func() error { return env.Clientset.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{}) }
		},
		"its service account": func(t *testing.T) (string, string, func() error) {
			sa := serviceAccount(t, ns, "leaving")
			return sa.Token, "serviceaccounts", func() error {
				return env.Clientset.CoreV1().ServiceAccounts(ns).Delete(ctx, sa.Name, metav1.DeleteOptions{})
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			token, resource, deleteIt := tc(t)
			deletions := proxyMetric(t, "watchgate_proxy_bound_object_deletions_total", map[string]string{"resource": resource})
			t0 := time.Now()
			if code, decision, err := send(c, p.URL, token, stale); err != nil || code != http.StatusOK || decision != "reject; reason=StaleResourceVersion; budget=everyone" {
				t.Fatalf("stale watch with the object: HTTP %d %q %v, want 200 answered by watchgate", code, decision, err)
			}
			if err := deleteIt(); err != nil {
				t.Fatal(err)
			}
			deleted := time.Now()
			for {
				code, decision, err := send(c, p.URL, token, stale)
				if err != nil {
					t.Fatal(err)
				}
				if code == http.StatusUnauthorized && decision == "" {
					t.Logf("refused %v after the deletion", time.Since(deleted).Round(time.Millisecond))
					if proxyMetric(t, "watchgate_proxy_bound_object_deletions_total", map[string]string{"resource": resource}) <= deletions {
						t.Errorf("refused, but no deletion of %s was counted as seen by the watch", resource)
					}
					return
				}
				if time.Since(t0) >= foundTTL {
					t.Fatalf("the token still served (HTTP %d %q) %v after the deletion: watchgate refuses it only once its lookup expires",
						code, decision, time.Since(deleted).Round(time.Millisecond))
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// nodeToken creates a node object (no kubelet) and returns it and a token
// of sa bound to it.
func nodeToken(t *testing.T, namespace, sa, name string) (*corev1.Node, string) {
	t.Helper()
	ctx := context.Background()
	node, err := env.Clientset.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Clientset.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	tr, err := env.Clientset.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return node, tr.Status.Token
}
