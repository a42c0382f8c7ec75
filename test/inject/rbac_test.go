package inject

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/watchgate/watchgate/inject"
	"github.com/watchgate/watchgate/test/apiserver"
)

// The CA publisher and the webhook work as a service account that holds
// only the ClusterRole make manifests renders from the package's markers
// (config/webhook/rbac/role.yaml), and that role lets it change no
// ConfigMap but watchgate-root-ca.crt: create is the one verb Kubernetes
// cannot limit by name.
func TestTheInjectorWorksWithItsClusterRoleAlone(t *testing.T) {
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join(apiserver.RepoRoot(), "config", "webhook", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(raw, role); err != nil {
		t.Fatal(err)
	}
	sa, err := env.ServiceAccount(ctx, "injector-rbac", uniqueName("injector"))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Grant(ctx, sa, role.Rules...); err != nil {
		t.Fatal(err)
	}

	p := startProxy(t)
	startInjectorAs(t, env.ConfigFor(sa.Token, "", nil), p.Target, filepath.Join(p.Dir, "ca.crt"))
	ns := uniqueName("rbac")
	namespace(t, ns, map[string]string{inject.LabelInject: inject.ValueEnabled}, "agent")
	assertRouted(t, createPod(t, ns, simplePod("routed", "agent")), p.Target)
	eventually(t, 30*time.Second, "CA published in "+ns+" by the injector's own service account", func() (bool, error) {
		return configMapCA(t, ns) == string(p.CA), nil
	})

	user := "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
	for _, c := range []struct {
		verb, resource, name string
		want                 bool
	}{
		{"update", "configmaps", inject.ConfigMapName, true},
		{"patch", "configmaps", inject.ConfigMapName, true},
		{"create", "configmaps", "", true},
		{"update", "configmaps", "kube-root-ca.crt", false},
		{"patch", "configmaps", "other", false},
		{"delete", "configmaps", inject.ConfigMapName, false},
		{"list", "configmaps", "", false},
		{"list", "pods", "", true},
		{"get", "pods", "some-pod", false},
		{"get", "secrets", "some-secret", false},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "kube-system", Verb: c.verb, Resource: c.resource, Name: c.name},
		}}
		got, err := env.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != c.want {
			t.Errorf("the injector's role: %s %s %q in kube-system allowed = %v, want %v", c.verb, c.resource, c.name, got.Status.Allowed, c.want)
		}
	}
}
