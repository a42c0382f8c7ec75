package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/watchgate/watchgate/test/apiserver"
)

// PauseImage is the pod sandbox image the node starts every pod with,
// imported by hack/cluster.sh; a pod may run it as a container that only
// waits.
const PauseImage = "localhost/watchgate/pause:v1.37.2"

// ChartAppVersion is the chart's appVersion: the tag its default values
// run.
func ChartAppVersion() (string, error) {
	b, err := os.ReadFile(filepath.Join(apiserver.RepoRoot(), "charts", "watchgate", "Chart.yaml"))
	if err != nil {
		return "", err
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		return "", err
	}
	return chart.AppVersion, nil
}

// ImportWatchgateImage builds watchgate's image as `make image` does
// (hack/image, for linux/amd64), tagged ghcr.io/watchgate/watchgate:version,
// into dir and imports it: with version the chart's appVersion, the
// chart's default values run it.
func (c *Cluster) ImportWatchgateImage(ctx context.Context, dir, version string) (string, error) {
	root := apiserver.RepoRoot()
	out := filepath.Join(dir, "image")
	cmd := []string{"go", "run", ".", "-src", root, "-out", out, "-version", version, "-platforms", "linux/amd64"}
	if _, err := commandIn(ctx, filepath.Join(root, "hack", "image"), cmd[0], cmd[1:]...); err != nil {
		return "", fmt.Errorf("make image: %w", err)
	}
	tarball := filepath.Join(out, "watchgate-linux-amd64.tar")
	return "ghcr.io/watchgate/watchgate:" + version, c.Import(ctx, tarball)
}

// ImportProgram builds the main package pkg of watchgate's module (a
// path like ./test/cluster/agent) as a static binary, puts it in an image
// ref of its own (hack/cluster's imagetar: the binary is the entrypoint,
// run as 65532) and imports it.
func (c *Cluster) ImportProgram(ctx context.Context, dir, pkg, ref string) error {
	name := filepath.Base(pkg)
	bin := filepath.Join(dir, name)
	if _, err := commandIn(ctx, apiserver.RepoRoot(), "go", "build", "-trimpath", "-o", bin, pkg); err != nil {
		return err
	}
	tarball := filepath.Join(dir, name+".tar")
	if _, err := command(ctx, filepath.Join(c.BinDir, "imagetar"), "-binary", bin, "-ref", ref, "-out", tarball); err != nil {
		return err
	}
	return c.Import(ctx, tarball)
}

// commandIn is command with its working folder dir and CGO off (static
// binaries for scratch images).
func commandIn(ctx context.Context, dir, name string, args ...string) (string, error) {
	return commandEnv(ctx, dir, []string{"CGO_ENABLED=0"}, name, args...)
}

func commandEnv(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	cmd := execCommand(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
