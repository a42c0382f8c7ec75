package apiserver

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
// the watchgate chart, and returns its stdout. The chart holds no custom
// resource and no hook (watchgate's leader creates the default budgets),
// so Helm needs neither --wait nor the CRD to be served first; logf is
// kept for callers that log what an install did.
func (e *Env) HelmInstall(ctx context.Context, bin string, logf func(string, ...any), args ...string) (string, error) {
	return Helm(ctx, bin, e.Kubeconfig, args...)
}
