//go:build load

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
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

// writeLoadBlock writes text as file's block for a run at n watches,
// between <!-- load-n:begin --> and <!-- load-n:end -->, so that runs at
// different counts keep their own blocks. A count without a block gets one
// after the last load block.
func writeLoadBlock(file string, n int, text string) error {
	begin, end := fmt.Sprintf("<!-- load-%d:begin -->", n), fmt.Sprintf("<!-- load-%d:end -->", n)
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if s := string(data); !strings.Contains(s, begin) {
		last := loadBlockEnd.FindAllStringIndex(s, -1)
		if last == nil {
			return fmt.Errorf("%s has no load block to add %s after", file, begin)
		}
		at := last[len(last)-1][1]
		s = s[:at] + "\n\n" + begin + "\n" + end + s[at:]
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			return err
		}
	}
	return replaceBetween(file, begin, end, text)
}

// loadBlockEnd matches the end marker of any load block.
var loadBlockEnd = regexp.MustCompile(`<!-- load-[0-9]+:end -->`)

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

func TestWriteLoadBlock(t *testing.T) {
	file := filepath.Join(t.TempDir(), "B.md")
	before := "# B\n\n<!-- load-10000:begin -->\nold 10k\n<!-- load-10000:end -->\n\n## next\n"
	if err := os.WriteFile(file, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeLoadBlock(file, 50000, "new 50k\n"); err != nil {
		t.Fatal(err)
	}
	if err := writeLoadBlock(file, 10000, "new 10k\n"); err != nil {
		t.Fatal(err)
	}
	if err := writeLoadBlock(file, 50000, "newer 50k\n"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(file)
	want := "# B\n\n<!-- load-10000:begin -->\nnew 10k\n<!-- load-10000:end -->\n\n<!-- load-50000:begin -->\nnewer 50k\n<!-- load-50000:end -->\n\n## next\n"
	if string(got) != want {
		t.Errorf("file:\n%s\nwant:\n%s", got, want)
	}
	if err := writeLoadBlock(filepath.Join(t.TempDir(), "none.md"), 1, "x"); err == nil {
		t.Error("a missing file was written")
	}
}

// loadOrder parses LOAD_ORDER, the order of the side-by-side paths: a
// permutation of 0, 1 and 2 separated by commas; 0,1,2 when empty.
func loadOrder(t *testing.T, v string) []int {
	t.Helper()
	if v == "" {
		return []int{0, 1, 2}
	}
	var order []int
	for f := range strings.SplitSeq(v, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || i < 0 || i > 2 || slices.Contains(order, i) {
			t.Fatalf("LOAD_ORDER=%q: want a permutation of 0 (watchgate without limits), 1 (as charted) and 2 (the bare proxy), e.g. 2,0,1", v)
		}
		order = append(order, i)
	}
	if len(order) != 3 {
		t.Fatalf("LOAD_ORDER=%q: want all three paths, e.g. 2,0,1", v)
	}
	return order
}
