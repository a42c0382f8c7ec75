package packaging

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestHelmTemplateAppliesToTheAPIServer renders the chart with the default
// values and with every testdata/values-*.yaml, installs its CRD for real (so
// that WatchBudgets validate against it), and applies every object with
// server-side apply and --dry-run=server: the API server validates each one
// (strict field validation, OpenAPI, CEL) without keeping it.
func TestHelmTemplateAppliesToTheAPIServer(t *testing.T) {
	installPrerequisites(t)
	cases := map[string][]string{"default values": nil}
	for _, f := range valuesFiles(t) {
		cases[filepath.Base(f)] = []string{"--values", f}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			ns := "dry-run-" + strings.TrimSuffix(strings.TrimPrefix(filepath.Base(strings.Join(args, "")), "values-"), ".yaml")
			if args == nil {
				ns = "dry-run-default"
			}
			createNamespace(t, ns)
			manifests := render(t, "watchgate", ns, args...)
			deployments := 0
			for _, o := range decode(t, manifests) {
				if o.GetKind() == "Deployment" {
					deployments++
				}
			}
			if deployments == 0 {
				t.Fatal("no Deployment in the manifests")
			}
			applyDryRun(t, manifests)
		})
	}
}

// TestKustomizeDefaultAppliesToTheAPIServer renders config/default with
// kubectl's built-in kustomize, with no component and with each TLS
// component, installs its Namespace and CRD for real and dry-run applies
// everything.
func TestKustomizeDefaultAppliesToTheAPIServer(t *testing.T) {
	installPrerequisites(t)
	for _, component := range []string{"", "tls-secret", "certmanager"} {
		name := component
		if name == "" {
			name = "no component"
		}
		t.Run(name, func(t *testing.T) {
			manifests := kustomizeDefault(t, component)
			objs := decode(t, manifests)
			// kubectl apply -k cannot map a custom resource whose CRD it
			// creates in the same run: config/default must hold none.
			for _, o := range objs {
				if o.GroupVersionKind().Group == "watchgate.io" {
					t.Errorf("config/default holds %s %s: a first `kubectl apply -k` would fail on it", o.GetKind(), o.GetName())
				}
			}
			ns := find(t, objs, "Namespace", "watchgate-system")
			applyForReal(t, toYAML(t, ns))
			applyDryRun(t, manifests)
			dep := find(t, objs, "Deployment", "watchgate")
			args := strings.Join(stringSlice(dep.Object, "spec", "template", "spec", "containers", "0", "args"), " ")
			if withTLS := component != ""; withTLS != strings.Contains(args, "--tls-cert-file=/etc/watchgate/tls/tls.crt") {
				t.Errorf("component %q: Deployment args %q", component, args)
			}
		})
	}
}

// kustomizeDefault renders config/default, with a component of
// config/default/components when component is not empty (through a
// temporary overlay, as an operator would).
func kustomizeDefault(t *testing.T, component string) string {
	t.Helper()
	dir := filepath.Join(root, "config", "default")
	if component != "" {
		dir = t.TempDir()
		// kustomize wants relative paths.
		base, err := filepath.Rel(dir, filepath.Join(root, "config", "default"))
		if err != nil {
			t.Fatal(err)
		}
		overlay := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
			"resources:\n- " + base + "\n" +
			"components:\n- " + filepath.Join(base, "components", component) + "\n"
		writeFile(t, filepath.Join(dir, "kustomization.yaml"), overlay)
	}
	out, err := kubectl(t, "", "kustomize", dir)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	prerequisites sync.Once
	// firstInstall is the output of the first `helm install` of the test
	// binary, NOTES included.
	firstInstall string
)

// Where installPrerequisites installs the chart for real.
const (
	releaseName      = "watchgate"
	releaseNamespace = "helm-install"
)

// installPrerequisites installs, for real and once per test binary, the
// chart itself with `helm upgrade --install` (its CRD is what the
// WatchBudgets of the other tests validate against) and the stand-in CRDs
// of cert-manager and the Prometheus Operator, and waits until they are
// served. The test bed runs no kubelet, so no pod starts; every object is
// created and validated all the same.
func installPrerequisites(t *testing.T) {
	t.Helper()
	var failed error
	prerequisites.Do(func() {
		firstInstall, failed = helmInstall(t, "upgrade", "--install", releaseName, chart, "--namespace", releaseNamespace, "--create-namespace", "--timeout=2m")
		if failed != nil {
			return
		}
		if _, failed = kubectl(t, readFile(t, "test/packaging/testdata/stub-crds.yaml"), "apply", "--server-side", "-f", "-"); failed != nil {
			return
		}
		_, failed = kubectl(t, "", "wait", "--for=condition=Established", "--timeout=60s",
			"crd/watchbudgets.watchgate.io", "crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io", "crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com")
	})
	if failed != nil {
		t.Fatal(failed)
	}
}

// createNamespace creates ns for real (dry-run objects need their
// namespace to exist), labelled to enforce the restricted Pod Security
// Standard, which the chart's pods must meet.
func createNamespace(t *testing.T, ns string) {
	t.Helper()
	applyForReal(t, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: "+ns+"\n  labels:\n    pod-security.kubernetes.io/enforce: restricted\n    pod-security.kubernetes.io/warn: restricted\n")
}

func applyForReal(t *testing.T, manifests string) {
	t.Helper()
	if _, err := kubectl(t, manifests, "apply", "--server-side", "--field-manager=packaging-test", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// applyDryRun applies manifests with server-side apply and
// --dry-run=server, with strict field validation; any warning (an unknown
// field, a Pod Security violation, a deprecated API) fails the test too.
func applyDryRun(t *testing.T, manifests string) {
	t.Helper()
	warnings, err := dryRun(t, manifests)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warnings {
		t.Errorf("kubectl apply: %s", w)
	}
}

// dryRun applies manifests with --dry-run=server and returns kubectl's
// warnings; it fails the test unless the API server answered for every
// object.
func dryRun(t *testing.T, manifests string) (warnings []string, err error) {
	t.Helper()
	out, err := kubectl(t, manifests, "apply", "--server-side", "--force-conflicts", "--field-manager=packaging-test",
		"--dry-run=server", "--validate=strict", "-f", "-")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "Warning:") {
			warnings = append(warnings, line)
		}
	}
	if want := len(decode(t, manifests)); strings.Count(out, "(server dry run)") != want {
		t.Errorf("dry run applied %d objects, want %d:\n%s", strings.Count(out, "(server dry run)"), want, out)
	}
	return warnings, nil
}

// TestDryRunCatchesWhatItShould proves the checks above have teeth: a pod
// that breaks the restricted Pod Security Standard draws a warning, and a
// field the API does not know is refused.
func TestDryRunCatchesWhatItShould(t *testing.T) {
	installPrerequisites(t)
	createNamespace(t, "dry-run-teeth")
	privileged := render(t, "watchgate", "dry-run-teeth", "--set", "containerSecurityContext.allowPrivilegeEscalation=true")
	warnings, err := dryRun(t, privileged)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "allowPrivilegeEscalation") }) {
		t.Errorf("allowPrivilegeEscalation=true drew no Pod Security warning; warnings: %v", warnings)
	}
	bad := strings.Replace(render(t, "watchgate", "dry-run-teeth"), "sessionAffinity: ClientIP", "sessionAffinity: ClientIP\n  sessionAfinity: ClientIP", 1)
	if _, err := dryRun(t, bad); err == nil || !strings.Contains(err.Error(), "sessionAfinity") {
		t.Errorf("an unknown field in a Service was not refused: %v", err)
	}
}

func toYAML(t *testing.T, o *unstructured.Unstructured) string {
	t.Helper()
	b, err := yaml.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// stringSlice reads a []string at path, where a numeric element indexes a
// list.
func stringSlice(obj map[string]any, path ...string) []string {
	var cur any = obj
	for _, p := range path {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[p]
		case []any:
			i := 0
			for _, r := range p {
				i = i*10 + int(r-'0')
			}
			if i >= len(c) {
				return nil
			}
			cur = c[i]
		default:
			return nil
		}
	}
	list, _ := cur.([]any)
	out := make([]string, 0, len(list))
	for _, v := range list {
		s, _ := v.(string)
		out = append(out, s)
	}
	return out
}
