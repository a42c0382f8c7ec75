package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
)

// TestMetricsNeedTheMetricsReaderRole scrapes the metrics Service as the
// chart's ServiceMonitor would (https, the pod's service-account token,
// by the Service's DNS name) from two pods: the one whose account has the
// chart's metrics-reader ClusterRole gets 200, the other 403.
func TestMetricsNeedTheMetricsReaderRole(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs := cl.Clientset
	ns := "monitoring-" + utilrand.String(5)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	for _, sa := range []string{"prometheus", "nobody"} {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	binding := "prometheus-" + ns
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: releaseName + "-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "prometheus"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding, metav1.DeleteOptions{})
	})

	url := "https://" + releaseName + "-metrics." + releaseNS + ".svc:8080/metrics"
	for sa, want := range map[string]string{"prometheus": "status 200\n", "nobody": "status 403\n"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: sa},
			Spec: corev1.PodSpec{
				ServiceAccountName: sa,
				RestartPolicy:      corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "scrape", Image: agentImage, ImagePullPolicy: corev1.PullNever, Args: []string{"-get", url},
				}},
			},
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		logs := waitForLog(t, ctx, ns, sa, "status ")
		if !strings.Contains(logs, want) {
			t.Errorf("GET %s as %s: %q, want %q", url, sa, logs, want)
		}
	}
}
