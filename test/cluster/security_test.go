package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestImageRunsAsTheChartRendersIt reads, from the node's /proc, what the
// real runtime made of each replica's container: the image's nonroot
// user, no capabilities (effective, permitted or bounding), no privilege
// escalation, the RuntimeDefault seccomp filter and a read-only root
// filesystem.
func TestImageRunsAsTheChartRendersIt(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods := replicaPods(t, ctx)
	if len(pods) == 0 {
		t.Fatal("no ready replica")
	}
	for _, p := range pods {
		if len(p.Status.ContainerStatuses) == 0 {
			t.Fatalf("pod %s has no container status", p.Name)
		}
		_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
		pid, err := os.ReadFile(filepath.Join(cl.Dir, "containerd", "state", "io.containerd.runtime.v2.task", "k8s.io", id, "init.pid"))
		if err != nil {
			t.Fatalf("pod %s: the container's process: %v", p.Name, err)
		}
		proc := filepath.Join("/proc", strings.TrimSpace(string(pid)))
		status, err := os.ReadFile(filepath.Join(proc, "status"))
		if err != nil {
			t.Fatal(err)
		}
		fields := map[string]string{}
		for _, line := range strings.Split(string(status), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				fields[k] = strings.Join(strings.Fields(v), " ")
			}
		}
		for k, want := range map[string]string{
			"Uid": "65532 65532 65532 65532", "Gid": "65532 65532 65532 65532",
			"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": "0000000000000000",
			"NoNewPrivs": "1", "Seccomp": "2",
		} {
			if fields[k] != want {
				t.Errorf("pod %s: %s is %q, want %q", p.Name, k, fields[k], want)
			}
		}
		mounts, err := os.ReadFile(filepath.Join(proc, "mountinfo"))
		if err != nil {
			t.Fatal(err)
		}
		root := ""
		for _, line := range strings.Split(string(mounts), "\n") {
			if f := strings.Fields(line); len(f) > 5 && f[4] == "/" {
				root = f[5]
			}
		}
		if !strings.HasPrefix(root, "ro,") && root != "ro" {
			t.Errorf("pod %s: the root filesystem is mounted %q, want read-only", p.Name, root)
		}
	}
}
