package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	topv1alpha1 "github.com/watchgate/watchgate/api/top/v1alpha1"
	"github.com/watchgate/watchgate/inject"
)

// TestInjectedAgentListsAndWatchesThroughWatchgate runs a client-go
// informer program in a pod of a labelled namespace, under a service
// account of its own: it finds the API server at the proxy Service's DNS
// name, verifies TLS against the CA watchgate published into the
// namespace, lists and watches ConfigMaps through watchgate, and the
// replica serving it counts its watch under its own service account.
func TestInjectedAgentListsAndWatchesThroughWatchgate(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := labelledNamespace(t, ctx)
	cs := cl.Clientset

	startAgent(t, ctx, ns)
	logs := waitForLog(t, ctx, ns, "agent", "synced\n")
	wantHost := "https://" + proxyService + "." + releaseNS + ".svc.cluster.local:443"
	if !strings.Contains(logs, "server "+wantHost+"\n") {
		t.Errorf("the agent's in-cluster config does not name the proxy Service %s:\n%s", wantHost, logs)
	}
	// The watch: an object created now reaches the agent's informer.
	probe := "probe-" + utilrand.String(5)
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: probe}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, ctx, ns, "agent", "add "+probe+"\n")

	// The CA the agent verified is the one watchgate published, which is
	// the CA of the proxy's serving certificate.
	published, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, inject.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secret, err := cs.CoreV1().Secrets(releaseNS).Get(ctx, "watchgate-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if published.Data[inject.ConfigMapKey] != string(secret.Data["ca.crt"]) {
		t.Errorf("%s/%s does not hold the serving certificate's CA", ns, inject.ConfigMapName)
	}

	// Charged to its own service account, on the replica that serves it.
	agent := "system:serviceaccount:" + ns + ":agent"
	reader := topReader(t, ctx)
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, p := range replicaPods(t, ctx) {
			report, err := top(ctx, p, reader, secret.Data["ca.crt"])
			if err != nil {
				return false, err
			}
			for _, b := range report.Budgets {
				for _, id := range b.Identities {
					if id.User == agent && id.Watches >= 1 {
						t.Logf("replica %s: budget %s counts %d open watch(es) of %s", p.Name, b.Name, id.Watches, agent)
						return true, nil
					}
				}
			}
		}
		return false, nil
	}); err != nil {
		t.Errorf("no replica counts an open watch of %s: %v", agent, err)
	}
}

// startAgent runs test/cluster/agent in ns under the service account
// agent, allowed to list and watch ConfigMaps there, and fails t unless
// the webhook routed its pod.
func startAgent(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	cs := cl.Clientset
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agent"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grant(t, ctx, ns, "agent", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent"},
		Spec: corev1.PodSpec{
			ServiceAccountName: "agent",
			Containers: []corev1.Container{{
				Name: "agent", Image: agentImage, ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	created, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := created.Annotations[inject.AnnotationStatus]; got != inject.StatusInjected {
		t.Fatalf("the agent's pod was not routed: %s=%q, %s=%q", inject.AnnotationStatus, got,
			inject.AnnotationReason, created.Annotations[inject.AnnotationReason])
	}

}

// grant gives the service account ns/name rules in ns.
func grant(t *testing.T, ctx context.Context, ns, name string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	if _, err := cl.Clientset.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Clientset.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitForLog waits until the log of container ns/pod holds want, and
// returns it.
func waitForLog(t *testing.T, ctx context.Context, ns, pod, want string) string {
	t.Helper()
	var logs string
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		b, err := cl.Clientset.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, nil //nolint:nilerr // not started yet: poll again
		}
		logs = string(b)
		return strings.Contains(logs, want), nil
	}); err != nil {
		p, _ := cl.Clientset.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		t.Fatalf("%s/%s never logged %q: %v\nlog:\n%s\nstatus: %+v", ns, pod, want, err, logs, p.Status)
	}
	return logs
}

// topReader is a bearer token allowed to read every budget's ranking.
func topReader(t *testing.T, ctx context.Context) string {
	t.Helper()
	name := "top-reader-" + utilrand.String(5)
	cs := cl.Clientset
	if _, err := cs.CoreV1().ServiceAccounts(releaseNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"watchgate.io"}, Resources: []string{"watchbudgets/status"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: releaseNS, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = cs.RbacV1().ClusterRoleBindings().Delete(bg, name, metav1.DeleteOptions{})
		_ = cs.RbacV1().ClusterRoles().Delete(bg, name, metav1.DeleteOptions{})
		_ = cs.CoreV1().ServiceAccounts(releaseNS).Delete(bg, name, metav1.DeleteOptions{})
	})
	tr, err := cs.CoreV1().ServiceAccounts(releaseNS).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// top reads one replica's TopReport at its pod's IP, sorted by open
// watches, verifying its certificate against ca for the proxy Service's
// name.
func top(ctx context.Context, p corev1.Pod, token string, ca []byte) (*topv1alpha1.TopReport, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no certificate in the CA")
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: proxyService + "." + releaseNS + ".svc",
	}}}
	url := "https://" + net.JoinHostPort(p.Status.PodIP, fmt.Sprint(containerPort(p, "https"))) + topv1alpha1.Path + "?sort=watches&limit=100"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("replica %s: %s: %s", p.Name, resp.Status, b)
	}
	var r topv1alpha1.TopReport
	return &r, json.Unmarshal(b, &r)
}

// containerPort is the port named name of p's first container that has
// one, or 0.
func containerPort(p corev1.Pod, name string) int32 {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == name {
				return port.ContainerPort
			}
		}
	}
	return 0
}
