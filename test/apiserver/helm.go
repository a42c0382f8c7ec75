package apiserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
)

// BuildHelm builds the helm pinned in hack/tools/go.mod into dir and
// returns its path. It points helm's configuration, cache and data
// folders (HELM_CONFIG_HOME, HELM_CACHE_HOME, HELM_DATA_HOME, for the whole
// process) into dir, away from the user's own.
func BuildHelm(dir string) (string, error) {
	for _, v := range []string{"HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME"} {
		if err := os.Setenv(v, filepath.Join(dir, strings.ToLower(v))); err != nil {
			return "", err
		}
	}
	bin := filepath.Join(dir, "helm")
	root := RepoRoot()
	build := exec.Command("go", "build", "-modfile="+filepath.Join(root, "hack", "tools", "go.mod"), "-o", bin, "helm.sh/helm/v3/cmd/helm")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build helm from hack/tools/go.mod: %w\n%s", err, out)
	}
	return bin, nil
}

// Helm runs the helm at bin against the API server of kubeconfig and
// returns its stdout; the error carries its stderr.
func Helm(ctx context.Context, bin, kubeconfig string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// HelmInstall runs `helm args...`, an install (or upgrade --install) of
// the watchgate chart. The chart creates its WatchBudgets in a
// post-install hook, after the CRD it creates with the release; Helm runs
// that hook as soon as it has created the release's objects, unless
// --wait (which needs pods to run, so not on the test bed) makes it wait
// for them. If the API server does not serve the WatchBudget kind yet,
// the hook fails with "ensure CRDs are installed first".
// docs/operators.md gives operators the remedy for that failure, and
// HelmInstall applies it once: wait until the kind is served, then
// `helm upgrade`, which runs the hooks again. logf reports that it did.
func (e *Env) HelmInstall(ctx context.Context, bin string, logf func(string, ...any), args ...string) (string, error) {
	out, err := Helm(ctx, bin, e.Kubeconfig, args...)
	if err == nil || !strings.Contains(err.Error(), "ensure CRDs are installed first") || len(args) == 0 {
		return out, err
	}
	logf("helm answered before the API server served the WatchBudget kind; waiting for it, then `helm upgrade` (docs/operators.md, Troubleshooting): %v", err)
	dc, derr := discovery.NewDiscoveryClientForConfig(e.Config)
	if derr != nil {
		return out, errors.Join(err, derr)
	}
	if werr := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, gerr := dc.ServerResourcesForGroupVersion("watchgate.io/v1alpha1")
		return gerr == nil, nil
	}); werr != nil {
		return out, errors.Join(err, fmt.Errorf("the API server did not serve watchgate.io/v1alpha1: %w", werr))
	}
	upgrade := slices.Clone(args)
	if upgrade[0] == "install" {
		upgrade[0] = "upgrade"
	}
	return Helm(ctx, bin, e.Kubeconfig, upgrade...)
}
