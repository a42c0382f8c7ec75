package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestChartCopiesOfGeneratedFilesAreFresh runs
// charts/watchgate/hack/sync-generated.sh into a temporary folder and
// compares its output with the chart's templates byte for byte: a change to
// the API types or an RBAC marker (make manifests) must be synced into the
// chart.
func TestChartCopiesOfGeneratedFilesAreFresh(t *testing.T) {
	out := t.TempDir()
	cmd := exec.CommandContext(t.Context(), filepath.Join(chart, "hack", "sync-generated.sh"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sync-generated.sh: %v\n%s", err, b)
	}
	for _, name := range []string{"crd-watchbudgets.yaml", "clusterrole.yaml", "role.yaml", "role-events.yaml", "injector-clusterrole.yaml"} {
		want, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, "charts/watchgate/templates/"+name); got != string(want) {
			t.Errorf("charts/watchgate/templates/%s is stale: run charts/watchgate/hack/sync-generated.sh", name)
		}
	}
}

// TestChartCRDIsTheGeneratedCRD renders the chart and compares its CRD with
// config/crd/bases: the spec is the same text, byte for byte, and the same
// object once parsed; the chart only adds labels and the keep annotation.
func TestChartCRDIsTheGeneratedCRD(t *testing.T) {
	generated := readFile(t, "config/crd/bases/watchgate.io_watchbudgets.yaml")
	rendered := render(t, "watchgate", "watchgate-system", "--show-only", "templates/crd-watchbudgets.yaml")

	if a, b := specText(t, generated), specText(t, rendered); a != b {
		t.Errorf("the spec of the chart's CRD differs from config/crd/bases (%d vs %d bytes)", len(b), len(a))
	}
	var gen, ren map[string]any
	if err := yaml.Unmarshal([]byte(generated), &gen); err != nil {
		t.Fatal(err)
	}
	crd := find(t, decode(t, rendered), "CustomResourceDefinition", "watchbudgets.watchgate.io")
	ren = crd.Object
	if !reflect.DeepEqual(gen["spec"], ren["spec"]) {
		t.Error("the chart's CRD spec does not parse to config/crd/bases' spec")
	}
	if got := crd.GetAnnotations()["helm.sh/resource-policy"]; got != "keep" {
		t.Errorf("CRD annotation helm.sh/resource-policy = %q, want keep (uninstall must not delete every WatchBudget)", got)
	}
	if got := crd.GetLabels()["app.kubernetes.io/name"]; got != "watchgate" {
		t.Errorf("CRD label app.kubernetes.io/name = %q, want the chart's standard labels", got)
	}

	// And crds.enabled=false leaves it out.
	if all := render(t, "watchgate", "watchgate-system", "--set", "crds.enabled=false"); strings.Contains(all, "kind: CustomResourceDefinition") {
		t.Error("crds.enabled=false still renders the CRD")
	}
	// crds.keep=false drops the annotation.
	noKeep := render(t, "watchgate", "watchgate-system", "--set", "crds.keep=false", "--show-only", "templates/crd-watchbudgets.yaml")
	if strings.Contains(noKeep, "resource-policy") {
		t.Error("crds.keep=false still renders helm.sh/resource-policy")
	}
}

// specText is everything from the line "spec:" up to the end of the
// document.
func specText(t *testing.T, manifest string) string {
	t.Helper()
	_, after, ok := strings.Cut(manifest, "\nspec:\n")
	if !ok {
		t.Fatalf("no spec in\n%s", manifest)
	}
	before, _, _ := strings.Cut(after, "\n---")
	return strings.TrimRight(before, "\n")
}

// TestChartRBACIsTheGeneratedRBAC renders the chart and compares its
// ClusterRole's and its manager Role's rules with config/rbac/role.yaml
// (rendered by controller-gen from the code's markers): exactly the same
// rules, so that the chart grants what the code uses and nothing more. The
// Role (markers with namespace=watchgate-system) is in the release
// namespace, whatever it is; pods are readable there only. The only other
// permission, the leader-election Lease, is a Role in the release namespace
// too.
func TestChartRBACIsTheGeneratedRBAC(t *testing.T) {
	generated := decode(t, readFile(t, "config/rbac/role.yaml"))
	genCR := find(t, generated, "ClusterRole", "watchgate-manager")
	var genRole, genEvents *unstructured.Unstructured
	for _, o := range generated {
		switch {
		case o.GetKind() == "Role" && o.GetNamespace() == "watchgate-system":
			genRole = o
		case o.GetKind() == "Role" && o.GetNamespace() == "default":
			genEvents = o
		}
	}
	if len(generated) != 3 || genRole == nil || genEvents == nil {
		t.Fatalf("config/rbac/role.yaml: want a ClusterRole, a Role in watchgate-system and a Role in default, got %d objects", len(generated))
	}

	objs := decode(t, render(t, "watchgate", "watchgate-system"))
	cr := find(t, objs, "ClusterRole", "watchgate-manager")
	if !reflect.DeepEqual(genCR.Object["rules"], cr.Object["rules"]) {
		t.Errorf("chart ClusterRole rules differ from config/rbac/role.yaml:\nchart: %v\nconfig: %v", cr.Object["rules"], genCR.Object["rules"])
	}
	role := find(t, objs, "Role", "watchgate-manager")
	if !reflect.DeepEqual(genRole.Object["rules"], role.Object["rules"]) {
		t.Errorf("chart Role rules differ from config/rbac/role.yaml:\nchart: %v\nconfig: %v", role.Object["rules"], genRole.Object["rules"])
	}
	events := find(t, objs, "Role", "watchgate-events")
	if !reflect.DeepEqual(genEvents.Object["rules"], events.Object["rules"]) || events.GetNamespace() != "default" {
		t.Errorf("chart events Role (in %q) rules differ from config/rbac/role.yaml's Role in default:\nchart: %v\nconfig: %v", events.GetNamespace(), events.Object["rules"], genEvents.Object["rules"])
	}

	// What the design says the code needs; a marker that disappears is a bug
	// in the code or in this list.
	for _, need := range []struct{ group, resource, verb string }{
		{"authentication.k8s.io", "tokenreviews", "create"},
		{"authorization.k8s.io", "subjectaccessreviews", "create"},
		{"watchgate.io", "watchbudgets", "watch"},
		{"watchgate.io", "watchbudgets/status", "patch"},
	} {
		if !allows(cr.Object["rules"], need.group, need.resource, need.verb) {
			t.Errorf("ClusterRole does not allow %s %s.%s", need.verb, need.resource, need.group)
		}
	}
	// Events about the cluster-scoped budgets go to default, leader
	// election's about its Lease to the release namespace; no Events
	// anywhere else.
	for _, g := range []string{"", "events.k8s.io"} {
		for _, verb := range []string{"create", "patch"} {
			if allows(cr.Object["rules"], g, "events", verb) {
				t.Errorf("ClusterRole allows %s events.%s cluster-wide; Events belong in the namespaced Roles", verb, g)
			}
		}
	}
	if !allows(events.Object["rules"], "events.k8s.io", "events", "create") || !allows(events.Object["rules"], "events.k8s.io", "events", "patch") {
		t.Errorf("events Role does not allow create and patch events.events.k8s.io: %v", events.Object["rules"])
	}
	if !allows(role.Object["rules"], "", "events", "create") {
		t.Errorf("manager Role does not allow leader election's Events: %v", role.Object["rules"])
	}
	// The pruner lists its replicas' pods in its own namespace, never
	// cluster-wide.
	if !allows(role.Object["rules"], "", "pods", "list") {
		t.Errorf("manager Role does not allow list pods: %v", role.Object["rules"])
	}
	// Local token verification gets the service account, pod or node a
	// token names (as kube-apiserver checks they still exist), in any
	// namespace, and watches their deletions (metadata only), so that a
	// deleted object's tokens are refused at once; secrets never.
	for _, resource := range []string{"serviceaccounts", "pods", "nodes"} {
		for _, verb := range []string{"get", "list", "watch"} {
			if !allows(cr.Object["rules"], "", resource, verb) {
				t.Errorf("ClusterRole does not allow %s %s", verb, resource)
			}
		}
	}
	if allows(cr.Object["rules"], "", "secrets", "get") {
		t.Errorf("ClusterRole allows get secrets")
	}
	// Scrapers of /metrics need get on the non-resource URL, nothing else.
	reader := find(t, objs, "ClusterRole", "watchgate-metrics-reader")
	if !reflect.DeepEqual(reader.Object["rules"], []any{map[string]any{"nonResourceURLs": []any{"/metrics"}, "verbs": []any{"get"}}}) {
		t.Errorf("metrics-reader ClusterRole rules = %v, want get /metrics only", reader.Object["rules"])
	}
	le := find(t, objs, "Role", "watchgate-leader-election")
	if le.GetNamespace() != "watchgate-system" || !allows(le.Object["rules"], "coordination.k8s.io", "leases", "update") {
		t.Errorf("leader-election Role: want leases in the release namespace, got %v in %q", le.Object["rules"], le.GetNamespace())
	}
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetName() != "watchgate-manager" && o.GetName() != "watchgate-metrics-reader" {
			t.Errorf("unexpected ClusterRole %s", o.GetName())
		}
	}
	for _, b := range []struct{ kind, roleKind, name string }{
		{"ClusterRoleBinding", "ClusterRole", "watchgate-manager"},
		{"RoleBinding", "Role", "watchgate-manager"},
		{"RoleBinding", "Role", "watchgate-events"},
	} {
		binding := find(t, objs, b.kind, b.name)
		if ref, _ := binding.Object["roleRef"].(map[string]any); ref["kind"] != b.roleKind || ref["name"] != b.name {
			t.Errorf("%s roleRef = %v, want %s %s", b.kind, ref, b.roleKind, b.name)
		}
		subjects, _ := binding.Object["subjects"].([]any)
		if len(subjects) != 1 || subjects[0].(map[string]any)["name"] != "watchgate" || subjects[0].(map[string]any)["namespace"] != "watchgate-system" {
			t.Errorf("%s subjects = %v, want the chart's ServiceAccount", b.kind, subjects)
		}
	}

	// In another release namespace, the Role and its binding follow it.
	for _, o := range decode(t, render(t, "watchgate", "ops")) {
		want := "ops"
		if o.GetName() == "watchgate-events" {
			want = "default" // where the events API writes the budgets' Events
		}
		if (o.GetKind() == "Role" || o.GetKind() == "RoleBinding") && o.GetNamespace() != want {
			t.Errorf("release in ops: %s %s is in %q", o.GetKind(), o.GetName(), o.GetNamespace())
		}
	}
	// rbac.create=false leaves out every role and binding.
	for _, o := range decode(t, render(t, "watchgate", "watchgate-system", "--set", "rbac.create=false")) {
		if strings.HasSuffix(o.GetKind(), "Role") || strings.HasSuffix(o.GetKind(), "RoleBinding") {
			t.Errorf("rbac.create=false still renders %s %s", o.GetKind(), o.GetName())
		}
	}
}

// allows reports whether one of the rules grants verb on group/resource.
func allows(rules any, group, resource, verb string) bool {
	list, _ := rules.([]any)
	for _, r := range list {
		rule, _ := r.(map[string]any)
		if has(rule["apiGroups"], group) && has(rule["resources"], resource) && has(rule["verbs"], verb) {
			return true
		}
	}
	return false
}

func has(list any, s string) bool {
	l, _ := list.([]any)
	for _, v := range l {
		if v == s || v == "*" {
			return true
		}
	}
	return false
}
