package cluster

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/watchgate/watchgate/test/apiserver"
)

// The release as docs/operators.md installs it.
const (
	releaseName = "watchgate"
	releaseNS   = "watchgate-system"
	// deployment is the proxy's Deployment, the release's full name.
	deployment     = "watchgate"
	webhookService = "watchgate-webhook"
	proxyService   = "watchgate"
)

// release is the chart installed once for the package, shared by the tests
// that need it as it is; a test that changes it puts it back.
var release struct {
	mu        sync.Mutex
	done      bool
	err       error
	installed time.Duration // helm install --wait
	injection time.Duration // the upgrade that turns injection on, and its rollout
}

func chartPath() string { return filepath.Join(apiserver.RepoRoot(), "charts", "watchgate") }

// ensureRelease installs the chart with its default values exactly as
// docs/operators.md says (`helm install … --wait`), then turns injection on
// with the documented upgrade and waits for the rollout.
func ensureRelease(t testing.TB) {
	t.Helper()
	Need(t, cl)
	release.mu.Lock()
	defer release.mu.Unlock()
	if !release.done {
		release.done = true
		release.err = installRelease()
	}
	if release.err != nil {
		t.Fatalf("the release: %v", release.err)
	}
}

func installRelease() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := apiserver.Helm(ctx, helm, cl.Kubeconfig, "install", releaseName, chartPath(),
		"--namespace", releaseNS, "--create-namespace", "--wait"); err != nil {
		return err
	}
	release.installed = time.Since(start)
	start = time.Now()
	if _, err := apiserver.Helm(ctx, helm, cl.Kubeconfig, "upgrade", "--install", releaseName, chartPath(),
		"-n", releaseNS, "--reuse-values", "--set", "injection.enabled=true"); err != nil {
		return err
	}
	if _, err := cl.Kubectl(ctx, "-n", releaseNS, "rollout", "status", "deployment/"+deployment, "--timeout=3m"); err != nil {
		return err
	}
	release.injection = time.Since(start)
	return nil
}
