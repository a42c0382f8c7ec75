package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/test/apiserver"
)

var plugin struct {
	once sync.Once
	path string
	err  error
}

// kubectlWatchgate builds the plugin (make plugin) once.
func kubectlWatchgate(t *testing.T, ctx context.Context) string {
	t.Helper()
	plugin.once.Do(func() {
		plugin.path = filepath.Join(buildDir, "kubectl-watchgate")
		_, plugin.err = commandIn(ctx, apiserver.RepoRoot(), "go", "build", "-o", plugin.path, "./cmd/kubectl-watchgate")
	})
	if plugin.err != nil {
		t.Fatal(plugin.err)
	}
	return plugin.path
}

// TestTopThroughPortForward runs `kubectl watchgate top` as docs/operators.md
// shows it, with a kubeconfig user's own token and RBAC: it port-forwards
// through kube-apiserver and the kubelet to both replicas, verifies their
// certificate against the CA published in watchgate's namespace, and ranks
// the routed agent's open watch under its own service account; for an
// admin, and for a user allowed only the documented Role and one budget's
// status (--budget). The other ways to give the CA work too:
// --ca-namespace (a labelled namespace) and --ca-file.
func TestTopThroughPortForward(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := labelledNamespace(t, ctx)
	startAgent(t, ctx, ns)
	waitForLog(t, ctx, ns, "agent", "synced\n")
	bin := kubectlWatchgate(t, ctx)
	agent := "system:serviceaccount:" + ns + ":agent"

	admin := tokenKubeconfig(t, ctx, "top-admin", rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"}, nil)
	budget := releaseName + "-agents"
	user := tokenKubeconfig(t, ctx, "top-user", rbacv1.RoleRef{}, []rbacv1.PolicyRule{
		{APIGroups: []string{"watchgate.io"}, Resources: []string{"watchbudgets/status"}, ResourceNames: []string{budget}, Verbs: []string{"get"}},
	})
	// As documented: the CA from the ConfigMap in watchgate's namespace.
	for _, run := range []struct {
		who, kubeconfig string
		args            []string
	}{
		{"an admin", admin, []string{"--sort", "watches"}},
		{"a user allowed " + budget + "'s status", user, []string{"--budget", budget, "--sort", "watches"}},
		{"an admin naming a labelled namespace's CA", admin, []string{"--ca-namespace", ns, "--sort", "watches"}},
	} {
		start := time.Now()
		out, err := command(ctx, bin, append([]string{"top", "-n", releaseNS, "--kubeconfig", run.kubeconfig}, run.args...)...)
		if err != nil {
			t.Errorf("kubectl watchgate top %s as %s: %v", strings.Join(run.args, " "), run.who, err)
			continue
		}
		t.Logf("kubectl watchgate top %s as %s took %.2fs:\n%s", strings.Join(run.args, " "), run.who, time.Since(start).Seconds(), out)
		if !strings.Contains(out, "BUDGET") || !strings.Contains(out, agent) {
			t.Errorf("kubectl watchgate top %s as %s: no row for %s:\n%s", strings.Join(run.args, " "), run.who, agent, out)
		}
	}

	secret, err := cl.Clientset.CoreV1().Secrets(releaseNS).Get(ctx, "watchgate-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, secret.Data["ca.crt"], 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := command(ctx, bin, "top", "-n", releaseNS, "--budget", budget, "--ca-file", caFile, "--sort", "watches", "--kubeconfig", user)
	if err != nil {
		t.Fatalf("kubectl watchgate top as a user allowed %s's status: %v", budget, err)
	}
	if !strings.Contains(out, agent) {
		t.Errorf("kubectl watchgate top --budget %s as a least-privileged user: no row for %s:\n%s", budget, agent, out)
	}
}

// tokenKubeconfig writes a kubeconfig for a new service account of the
// release's namespace, bound cluster-wide to role (when named) or given
// the cluster-wide rules plus docs/operators.md's Role watchgate-top
// (services, pods, pods/portforward, the CA ConfigMap) in the release's
// namespace.
func tokenKubeconfig(t *testing.T, ctx context.Context, prefix string, role rbacv1.RoleRef, rules []rbacv1.PolicyRule) string {
	t.Helper()
	cs := cl.Clientset
	name := prefix + "-" + utilrand.String(5)
	if _, err := cs.CoreV1().ServiceAccounts(releaseNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: releaseNS, Name: name}}
	if role.Name == "" {
		role = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().Roles(releaseNS).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "pods"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{""}, Resources: []string{"pods/portforward"}, Verbs: []string{"create"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"watchgate-root-ca.crt"}, Verbs: []string{"get"}},
		}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().RoleBindings(releaseNS).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subjects}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: role, Subjects: subjects}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = cs.RbacV1().ClusterRoleBindings().Delete(bg, name, metav1.DeleteOptions{})
		_ = cs.RbacV1().ClusterRoles().Delete(bg, name, metav1.DeleteOptions{})
		_ = cs.RbacV1().RoleBindings(releaseNS).Delete(bg, name, metav1.DeleteOptions{})
		_ = cs.RbacV1().Roles(releaseNS).Delete(bg, name, metav1.DeleteOptions{})
		_ = cs.CoreV1().ServiceAccounts(releaseNS).Delete(bg, name, metav1.DeleteOptions{})
	})
	tr, err := cs.CoreV1().ServiceAccounts(releaseNS).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(cl.Config.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	path, err := apiserver.WriteKubeconfig(&rest.Config{Host: cl.Config.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return path
}
