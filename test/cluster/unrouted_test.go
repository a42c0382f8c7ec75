package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/watchgate/watchgate/inject"
	"github.com/watchgate/watchgate/test/apiserver"
)

// TestUnroutedPodIsReported: with no replica to answer the webhook
// (scaled to 0), its failurePolicy Ignore admits a pod of a labelled
// namespace unrouted; once watchgate is back, its leader records a Warning
// Event NotRouted on that pod and counts it in
// watchgate_inject_unrouted_pods and watchgate_inject_unrouted_pods_total,
// scraped as the metrics reader does.
func TestUnroutedPodIsReported(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cs := cl.Clientset
	ns := labelledNamespace(t, ctx)

	release.mu.Lock()
	defer release.mu.Unlock()
	scale := func(n int) {
		t.Helper()
		if _, err := cl.Kubectl(ctx, "-n", releaseNS, "scale", "deployment/"+deployment, fmt.Sprintf("--replicas=%d", n)); err != nil {
			t.Fatal(err)
		}
	}
	scale(0)
	t.Cleanup(func() {
		_, _ = cl.Kubectl(context.Background(), "-n", releaseNS, "scale", "deployment/"+deployment, "--replicas=2")
	})
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := cs.AppsV1().Deployments(releaseNS).Get(ctx, deployment, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pods, err := cs.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: selector(d.Spec.Selector.MatchLabels)})
		return err == nil && len(pods.Items) == 0, err
	}); err != nil {
		t.Fatalf("the replicas did not go away: %v", err)
	}
	p, err := cs.CoreV1().Pods(ns).Create(ctx, unscheduledPod("while-down"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s := p.Annotations[inject.AnnotationStatus]; s != "" {
		t.Fatalf("with no replica, the pod was still answered: %s=%q", inject.AnnotationStatus, s)
	}

	scale(2)
	waitReplicasReady(t, ctx, "")
	var note string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := cs.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Regarding.Kind == "Pod" && e.Regarding.Name == p.Name && e.Reason == inject.ReasonNotRouted && e.Type == corev1.EventTypeWarning {
				note = e.Note
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no Warning Event %s on %s/%s: %v", inject.ReasonNotRouted, ns, p.Name, err)
	}
	t.Logf("Event %s: %s", inject.ReasonNotRouted, note)

	leader := leaderPod(t, ctx)
	token := metricsReader(t, ctx)
	var exists, total float64
	for _, rp := range replicaPods(t, ctx) {
		if rp.Name != leader {
			continue
		}
		b := scrape(t, ctx, rp, token)
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		exists = apiserver.Sum(fams, "watchgate_inject_unrouted_pods", nil)
		total = apiserver.Sum(fams, "watchgate_inject_unrouted_pods_total", nil)
	}
	if exists < 1 || total < 1 {
		t.Errorf("the leader %s: watchgate_inject_unrouted_pods %v, watchgate_inject_unrouted_pods_total %v; want at least 1 each", leader, exists, total)
	}
}

// metricsReader is a bearer token of a service account bound to the
// chart's metrics-reader ClusterRole.
func metricsReader(t *testing.T, ctx context.Context) string {
	t.Helper()
	cs := cl.Clientset
	name := "metrics-reader-" + utilrand.String(5)
	if _, err := cs.CoreV1().ServiceAccounts(releaseNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: releaseName + "-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: releaseNS, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = cs.CoreV1().ServiceAccounts(releaseNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	tr, err := cs.CoreV1().ServiceAccounts(releaseNS).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// scrape GETs a replica's /metrics at its pod's IP with token, as the
// ServiceMonitor does (insecureSkipVerify).
func scrape(t *testing.T, ctx context.Context, p corev1.Pod, token string) []byte {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as the chart's ServiceMonitor
	}}
	url := "https://" + net.JoinHostPort(p.Status.PodIP, fmt.Sprint(containerPort(p, "metrics"))) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	return b
}
