package packaging

import (
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartAndKustomizeInstallTheSameThing compares `helm template` with the
// default values (release watchgate in watchgate-system) with `kubectl
// kustomize config/default` plus its tls-secret component: the same
// objects, by kind and name, and the same substance in each (pod spec and
// its flags, the default budgets among them, Services, RBAC rules, CRD).
// Labels and comments may differ; behaviour may not.
func TestChartAndKustomizeInstallTheSameThing(t *testing.T) {
	chartObjs := index(decode(t, render(t, "watchgate", "watchgate-system")))
	kustObjs := index(decode(t, kustomizeDefault(t, "tls-secret")))

	// The chart writes the certificate Secret; kustomize expects the
	// operator (or cert-manager) to. kustomize creates the Namespace; Helm
	// is given one.
	delete(chartObjs, "Secret/watchgate-system/watchgate-tls")
	delete(kustObjs, "Namespace//watchgate-system")
	if a, b := sortedKeys(chartObjs), sortedKeys(kustObjs); !slices.Equal(a, b) {
		t.Fatalf("different objects:\nchart:     %v\nkustomize: %v", a, b)
	}

	same := func(key string, path ...string) {
		t.Helper()
		a, _, _ := unstructured.NestedFieldNoCopy(chartObjs[key].Object, path...)
		b, _, _ := unstructured.NestedFieldNoCopy(kustObjs[key].Object, path...)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s %s differs:\nchart:     %v\nkustomize: %v", key, strings.Join(path, "."), a, b)
		}
	}

	dep := "Deployment/watchgate-system/watchgate"
	for _, p := range [][]string{
		{"spec", "replicas"},
		{"spec", "strategy"},
		{"spec", "template", "spec", "serviceAccountName"},
		{"spec", "template", "spec", "securityContext"},
		{"spec", "template", "spec", "terminationGracePeriodSeconds"},
		{"spec", "template", "spec", "volumes"},
	} {
		same(dep, p...)
	}
	chartC, kustC := container(t, chartObjs[dep]), container(t, kustObjs[dep])
	for _, f := range []string{"image", "env", "ports", "livenessProbe", "readinessProbe", "resources", "securityContext", "volumeMounts"} {
		if !reflect.DeepEqual(chartC[f], kustC[f]) {
			t.Errorf("container %s differs:\nchart:     %v\nkustomize: %v", f, chartC[f], kustC[f])
		}
	}
	// Same flags; the TLS component appends its own at the end.
	if a, b := sortedStrings(chartC["args"]), sortedStrings(kustC["args"]); !slices.Equal(a, b) {
		t.Errorf("container args differ:\nchart:     %v\nkustomize: %v", a, b)
	}

	for _, svc := range []string{"Service/watchgate-system/watchgate", "Service/watchgate-system/watchgate-metrics"} {
		same(svc, "spec", "type")
		same(svc, "spec", "ports")
		same(svc, "spec", "sessionAffinity")
		same(svc, "spec", "sessionAffinityConfig")
	}
	same("PodDisruptionBudget/watchgate-system/watchgate", "spec", "minAvailable")
	same("PodDisruptionBudget/watchgate-system/watchgate", "spec", "unhealthyPodEvictionPolicy")
	same("ClusterRole//watchgate-manager", "rules")
	same("ClusterRole//watchgate-metrics-reader", "rules")
	same("ClusterRoleBinding//watchgate-manager", "roleRef")
	same("ClusterRoleBinding//watchgate-manager", "subjects")
	same("Role/watchgate-system/watchgate-manager", "rules")
	same("RoleBinding/watchgate-system/watchgate-manager", "roleRef")
	same("RoleBinding/watchgate-system/watchgate-manager", "subjects")
	same("Role/watchgate-system/watchgate-leader-election", "rules")
	same("RoleBinding/watchgate-system/watchgate-leader-election", "subjects")
	same("CustomResourceDefinition//watchbudgets.watchgate.io", "spec")
}

// index keys objects by kind/namespace/name.
func index(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	m := make(map[string]*unstructured.Unstructured, len(objs))
	for _, o := range objs {
		m[fmt.Sprintf("%s/%s/%s", o.GetKind(), o.GetNamespace(), o.GetName())] = o
	}
	return m
}

func sortedKeys(m map[string]*unstructured.Unstructured) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func container(t *testing.T, dep *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%s has %d containers, want 1", dep.GetName(), len(cs))
	}
	return cs[0].(map[string]any)
}

func sortedStrings(v any) []string {
	list, _ := v.([]any)
	out := make([]string, 0, len(list))
	for _, s := range list {
		out = append(out, fmt.Sprint(s))
	}
	slices.Sort(out)
	return out
}

// TestPrometheusConfigIsTheChartsMonitoring compares config/prometheus with
// the chart's ServiceMonitor and PrometheusRule (release watchgate in
// watchgate-system), and dry-run applies it.
func TestPrometheusConfigIsTheChartsMonitoring(t *testing.T) {
	installPrerequisites(t)
	chartObjs := index(decode(t, render(t, "watchgate", "watchgate-system",
		"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true")))
	manifests, err := kubectl(t, "", "kustomize", filepath.Join(root, "config", "prometheus"))
	if err != nil {
		t.Fatal(err)
	}
	kustObjs := index(decode(t, manifests))
	for _, key := range []string{"ServiceMonitor/watchgate-system/watchgate", "PrometheusRule/watchgate-system/watchgate"} {
		c, k := chartObjs[key], kustObjs[key]
		if c == nil || k == nil {
			t.Errorf("%s: in chart %t, in config/prometheus %t", key, c != nil, k != nil)
			continue
		}
		if !reflect.DeepEqual(c.Object["spec"], k.Object["spec"]) {
			t.Errorf("%s spec differs between the chart and config/prometheus", key)
		}
	}
	// The ServiceMonitor must select the metrics Service of both installs.
	kustDefault := index(decode(t, kustomizeDefault(t, "")))
	sel, _, _ := unstructured.NestedStringMap(kustObjs["ServiceMonitor/watchgate-system/watchgate"].Object, "spec", "selector", "matchLabels")
	for name, objs := range map[string]map[string]*unstructured.Unstructured{"chart": chartObjs, "kustomize": kustDefault} {
		svc := objs["Service/watchgate-system/watchgate-metrics"]
		if svc == nil {
			t.Fatalf("%s: no metrics Service", name)
		}
		for k, v := range sel {
			if svc.GetLabels()[k] != v {
				t.Errorf("%s: metrics Service lacks label %s=%s the ServiceMonitor selects", name, k, v)
			}
		}
	}
	createNamespace(t, "watchgate-system")
	applyDryRun(t, manifests)
}
