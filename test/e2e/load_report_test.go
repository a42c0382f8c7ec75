//go:build load

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/watchgate/watchgate/test/apiserver"
)

// The helpers the load runs (TestLoad, TestLoadHostileTenant) share: their
// settings from the environment, the machine they ran on, and the
// BENCHMARKS.md block each rewrites.

func kubectlApply(ctx context.Context, e *apiserver.Env, manifest string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(e.AssetsDir, "kubectl"), "--kubeconfig="+e.Kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl apply: %w: %s", err, out)
	}
	return nil
}

// replaceBetweenMarkers writes text between the load markers of file.
func replaceBetweenMarkers(file, text string) error {
	return replaceBetween(file, "<!-- load:begin -->", "<!-- load:end -->", text)
}

// replaceBetween writes text between the markers begin and end of file.
func replaceBetween(file, begin, end, text string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	s := string(data)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s … %s markers", file, begin, end)
	}
	return os.WriteFile(file, []byte(s[:i+len(begin)]+"\n"+text+s[j:]), 0o644)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func machine() string {
	cpus := 0
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		cpus = strings.Count(string(b), "\nprocessor") + 1
	}
	return fmt.Sprintf("%d cores, shared with other work", cpus)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
