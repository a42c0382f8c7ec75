package packaging

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestSeparateInjectorDeployment renders injection.separateDeployment: the
// webhook and CA publisher run in a Deployment of their own with
// --mode=injector and their own ServiceAccount, which alone holds the
// injector's ClusterRole; the proxy runs --mode=proxy without the webhook,
// and no proxy Service selects the injector's pods nor the webhook
// Service the proxy's. The injected host is fully qualified.
func TestSeparateInjectorDeployment(t *testing.T) {
	objs := decode(t, render(t, "watchgate", "watchgate-system", "--values", filepath.Join(root, "test", "packaging", "testdata", "values-injector.yaml")))
	proxyDep := find(t, objs, "Deployment", "watchgate")
	injDep := find(t, objs, "Deployment", "watchgate-injector")
	proxyArgs, injArgs := sortedStrings(container(t, proxyDep)["args"]), sortedStrings(container(t, injDep)["args"])
	if !slices.Contains(proxyArgs, "--mode=proxy") || slices.ContainsFunc(proxyArgs, func(a string) bool { return strings.HasPrefix(a, "--webhook-port") }) {
		t.Errorf("proxy args = %v, want --mode=proxy and no --webhook-port", proxyArgs)
	}
	for _, want := range []string{"--mode=injector", "--webhook-port=9443", "--inject-service-host=watchgate.watchgate-system.svc.cluster.local", "--leader-elect"} {
		if !slices.Contains(injArgs, want) {
			t.Errorf("injector args = %v, want %s", injArgs, want)
		}
	}
	if sa, _, _ := unstructured.NestedString(injDep.Object, "spec", "template", "spec", "serviceAccountName"); sa != "watchgate-injector" {
		t.Errorf("injector ServiceAccount = %q, want watchgate-injector", sa)
	}
	find(t, objs, "ServiceAccount", "watchgate-injector")
	binding := find(t, objs, "ClusterRoleBinding", "watchgate-injector")
	if subjects, _ := binding.Object["subjects"].([]any); len(subjects) != 1 || subjects[0].(map[string]any)["name"] != "watchgate-injector" {
		t.Errorf("injector ClusterRoleBinding subjects = %v, want only the injector's ServiceAccount", binding.Object["subjects"])
	}
	podLabels := func(d *unstructured.Unstructured) map[string]string {
		l, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		return l
	}
	selects := func(svc *unstructured.Unstructured, labels map[string]string) bool {
		sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	webhookSvc := find(t, objs, "Service", "watchgate-webhook")
	if !selects(webhookSvc, podLabels(injDep)) || selects(webhookSvc, podLabels(proxyDep)) {
		t.Errorf("webhook Service selector %v: want the injector's pods only", webhookSvc.Object["spec"])
	}
	for _, name := range []string{"watchgate", "watchgate-metrics"} {
		if svc := find(t, objs, "Service", name); selects(svc, podLabels(injDep)) || !selects(svc, podLabels(proxyDep)) {
			t.Errorf("Service %s selects the injector's pods or not the proxy's: %v", name, svc.Object["spec"])
		}
	}
	// Without separateDeployment, one Deployment does both, as before.
	same := decode(t, render(t, "watchgate", "watchgate-system", "--values", filepath.Join(root, "test", "packaging", "testdata", "values-injection.yaml")))
	dep := find(t, same, "Deployment", "watchgate")
	args := sortedStrings(container(t, dep)["args"])
	if !slices.Contains(args, "--webhook-port=9443") || !slices.Contains(args, "--inject-service-host=watchgate.watchgate-system.svc.cluster.local") {
		t.Errorf("injection in the proxy: args %v", args)
	}
	for _, o := range same {
		if strings.HasSuffix(o.GetName(), "-injector") && o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" {
			t.Errorf("without separateDeployment the chart renders %s %s", o.GetKind(), o.GetName())
		}
	}
	if b := find(t, same, "ClusterRoleBinding", "watchgate-injector"); !reflect.DeepEqual(b.Object["subjects"], []any{map[string]any{"kind": "ServiceAccount", "name": "watchgate", "namespace": "watchgate-system"}}) {
		t.Errorf("injector ClusterRoleBinding subjects = %v, want the proxy's ServiceAccount", b.Object["subjects"])
	}
}

// TestSeparateInjectorRBAC applies the separate injector's ServiceAccounts,
// roles and bindings to the API server and asks it what each
// ServiceAccount may do: the injector may do what the webhook, the CA
// publisher, its leader election and its /metrics filter need and no
// more; the proxy's ServiceAccount holds none of the injector's rights.
func TestSeparateInjectorRBAC(t *testing.T) {
	const release, ns = "rbacprobe", "injector-rbac"
	createNamespace(t, ns)
	var keep []string
	for _, doc := range strings.Split(render(t, release, ns, "--values", filepath.Join(root, "test", "packaging", "testdata", "values-injector.yaml")), "\n---") {
		for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
			if strings.Contains(doc, "\nkind: "+kind+"\n") {
				keep = append(keep, doc)
				break
			}
		}
	}
	applyForReal(t, strings.Join(keep, "\n---"))
	t.Cleanup(func() {
		for _, name := range []string{"manager", "injector", "injector-metrics-auth", "metrics-reader"} {
			_, _ = kubectl(t, "", "delete", "clusterrole,clusterrolebinding", release+"-watchgate-"+name, "--ignore-not-found")
		}
		_, _ = kubectl(t, "", "delete", "role,rolebinding", release+"-watchgate-events", "-n", "default", "--ignore-not-found")
	})
	injector := "system:serviceaccount:" + ns + ":" + release + "-watchgate-injector"
	proxy := "system:serviceaccount:" + ns + ":" + release + "-watchgate"
	for _, q := range []struct {
		as   string
		args []string
		want string
	}{
		{injector, []string{"update", "configmaps/watchgate-root-ca.crt", "-n", "default"}, "yes"},
		{injector, []string{"create", "configmaps", "-n", "default"}, "yes"},
		{injector, []string{"update", "configmaps/other", "-n", "default"}, "no"},
		{injector, []string{"list", "pods", "--all-namespaces"}, "yes"},
		{injector, []string{"update", "leases", "-n", ns}, "yes"},
		{injector, []string{"update", "leases", "-n", "default"}, "no"},
		{injector, []string{"create", "tokenreviews"}, "yes"},
		{injector, []string{"create", "subjectaccessreviews"}, "yes"},
		// The NotRouted Event on an unrouted pod, in the pod's namespace.
		{injector, []string{"create", "events.events.k8s.io", "-n", "team"}, "yes"},
		{injector, []string{"create", "events", "-n", "team"}, "no"},
		{proxy, []string{"update", "configmaps/watchgate-root-ca.crt", "-n", "default"}, "no"},
		{proxy, []string{"create", "configmaps", "-n", "default"}, "no"},
		{proxy, []string{"create", "events.events.k8s.io", "-n", "default"}, "yes"},
	} {
		// kubectl auth can-i exits 1 on "no"; the answer is what counts.
		out, _ := kubectl(t, "", append([]string{"auth", "can-i", "--as", q.as}, q.args...)...)
		if got := strings.TrimSpace(out); !strings.HasPrefix(got, q.want) {
			t.Errorf("%s: can-i %s = %q, want %s", q.as, strings.Join(q.args, " "), got, q.want)
		}
	}
}
