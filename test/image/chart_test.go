package image

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/watchgate/watchgate/test/apiserver"
)

// helm runs the pinned helm against the test API server and returns
// stdout; it fails the test on an error.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	out, err := apiserver.Helm(ctx, helmBin, env.Kubeconfig, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// installedDeployment installs the chart with its default values as
// release in namespace ns and returns the Deployment Helm applied.
func installedDeployment(t *testing.T, release, ns string) *appsv1.Deployment {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if _, err := env.HelmInstall(ctx, helmBin, t.Logf, "install", release, filepath.Join(root, "charts", "watchgate"), "--namespace", ns, "--create-namespace", "--timeout=2m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, _ = apiserver.Helm(ctx, helmBin, env.Kubeconfig, "uninstall", release, "--namespace", ns)
	})
	manifest := helm(t, "get", "manifest", release, "--namespace", ns)
	var found []*appsv1.Deployment
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	for {
		var obj map[string]any
		err := d.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decode the release's manifest: %v", err)
		}
		if obj["kind"] != "Deployment" {
			continue
		}
		var dep appsv1.Deployment
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &dep); err != nil {
			t.Fatal(err)
		}
		found = append(found, &dep)
	}
	if len(found) != 1 {
		t.Fatalf("the release has %d Deployments, want 1", len(found))
	}
	if n := len(found[0].Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("the Deployment has %d containers, want 1", n)
	}
	return found[0]
}
