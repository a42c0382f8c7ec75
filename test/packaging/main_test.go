package packaging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/watchgate/watchgate/test/apiserver"
)

// kubeVersion is what `helm template` and `helm lint` render for: the test
// bed's. (A helm built with `go build` believes it talks to Kubernetes 1.20,
// which the chart's kubeVersion refuses.)
const kubeVersion = "1.37.2"

var (
	env   *apiserver.Env
	root  = apiserver.RepoRoot()
	chart = filepath.Join(root, "charts", "watchgate")
	// helmBin is the helm pinned in hack/tools/go.mod, built once by TestMain.
	helmBin string
)

// TestMain builds the pinned helm and starts a control plane.
func TestMain(m *testing.M) {
	apiserver.Main(m, &env, apiserver.Suite{Helm: &helmBin})
}

// helm runs the pinned helm against the test API server and returns stdout;
// the error carries stderr.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	return apiserver.Helm(ctx, helmBin, env.Kubeconfig, args...)
}

// helmInstall runs an install of the chart the way env.HelmInstall does.
func helmInstall(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	return env.HelmInstall(ctx, helmBin, t.Logf, args...)
}

// render runs `helm template` for release name in namespace ns with extra
// arguments (-f, --set) and returns the manifests.
func render(t *testing.T, name, ns string, args ...string) string {
	t.Helper()
	out, err := helm(t, append([]string{"template", name, chart, "--namespace", ns, "--kube-version", kubeVersion}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kubectl runs the test bed's kubectl as the admin, reading stdin from in.
func kubectl(t *testing.T, in string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.AssetsDir, "kubectl"), append([]string{"--kubeconfig=" + env.Kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String() + stderr.String(), nil
}

// decode splits a multi-document YAML stream into objects, skipping empty
// documents.
func decode(t *testing.T, manifests string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	for {
		var m map[string]any
		err := d.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decode manifests: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// find returns the only object of the given kind and name; it fails the test
// when there is none or more than one.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one %s %q in the manifests, found %d", kind, name, len(found))
	}
	return found[0]
}

// readFile reads a file of the repository.
func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
