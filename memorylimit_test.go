package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/test/apiserver"
)

// The watchgate binary started without GOMEMLIMIT (on a machine without a
// cgroup memory limit, such as this test bed's, or with one) still holds
// itself to a memory budget: it logs where the budget came from, derives
// the watch cap from it rather than from physical memory, and its memory
// guard is on against it — at --memory-high-water-percent=1 a watch gets
// 503 MemoryHighWater, and the guard's limit metric shows the budget.
func TestWithoutGOMEMLIMITTheBinaryHoldsItselfToABudget(t *testing.T) {
	ctx := t.Context()
	sa, err := env.ServiceAccount(ctx, "memlimit-test", "watcher")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Grant(ctx, sa, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}}); err != nil {
		t.Fatal(err)
	}

	bin := filepath.Join(t.TempDir(), "watchgate")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Dir = apiserver.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	proxyAddr, metricsAddr, probeAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	cmd := exec.Command(bin,
		"--kubeconfig", env.Kubeconfig,
		"--proxy-bind-address", proxyAddr,
		"--metrics-bind-address", metricsAddr, "--metrics-secure=false",
		"--health-probe-bind-address", probeAddr,
		"--pod-name", "memlimit-test-0",
		"--shutdown-grace-period", "1s",
		"--memory-high-water-percent", "1",
	)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	log := &apiserver.LockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("watchgate log:\n%s", log.String())
		}
	})
	plain := &http.Client{Timeout: 5 * time.Second}
	apiserver.WaitWhileRunning(t, exited, &waitErr, 90*time.Second, "/readyz", func() bool {
		code, _ := get(t, plain, "http://"+probeAddr+"/readyz", "")
		return code == http.StatusOK
	})

	// The guard is on: far above 1% of the budget, a watch is refused.
	insecure := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+proxyAddr+"/api/v1/namespaces/memlimit-test/configmaps?watch=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+sa.Token)
	resp, err := insecure.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if decision := resp.Header.Get(proxy.DecisionHeader); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(decision, "reason="+proxy.GuardMemoryHighWater) {
		t.Errorf("a watch at --memory-high-water-percent=1 = %d %q, want 503 with reason=%s", resp.StatusCode, decision, proxy.GuardMemoryHighWater)
	}

	limit := logLine(t, log.String(), "Memory limit")
	source, _ := limit["source"].(string)
	limitBytes, goMemLimit := logUint(t, limit, "limitBytes"), logUint(t, limit, "goMemLimitBytes")
	switch source {
	case proxy.MemoryLimitFromFallback:
		if limitBytes == 0 || limitBytes > 512<<20 {
			t.Errorf("fallback limit %d bytes, want at most 512 MiB", limitBytes)
		}
	case proxy.MemoryLimitFromCgroup:
	default:
		t.Fatalf("memory limit from %q, want %q or %q (the binary ran without GOMEMLIMIT)", source, proxy.MemoryLimitFromFallback, proxy.MemoryLimitFromCgroup)
	}
	if want := limitBytes / 10 * 9; goMemLimit < want || goMemLimit > want+9 {
		t.Errorf("goMemLimitBytes %d, want 90%% of %d", goMemLimit, limitBytes)
	}
	if why, _ := limit["why"].(string); !strings.Contains(why, "GOMEMLIMIT") {
		t.Errorf("the log does not say why: %q", why)
	}
	watchCap := logLine(t, log.String(), "Watch cap")
	if got, want := logUint(t, watchCap, "maxWatches"), proxy.MaxWatchesFor(proxy.MemoryLimit{GoMemLimit: goMemLimit}); got != uint64(want) {
		t.Errorf("maxWatches %d, want %d, derived from the Go runtime's limit %d", got, want, goMemLimit)
	}
	if from, _ := watchCap["from"].(string); from != source {
		t.Errorf("watch cap from %q, want %q", from, source)
	}

	_, metrics := get(t, plain, "http://"+metricsAddr+"/metrics", "")
	if got := metricValue(metrics, "watchgate_proxy_memory_limit_bytes"); got != strconv.FormatUint(goMemLimit, 10) && got != strconv.FormatFloat(float64(goMemLimit), 'g', -1, 64) {
		t.Errorf("watchgate_proxy_memory_limit_bytes = %q, want %d", got, goMemLimit)
	}
}

// logLine is the first JSON log line whose msg is msg.
func logLine(t *testing.T, log, msg string) map[string]any {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.UseNumber()
		if d.Decode(&line) == nil && line["msg"] == msg {
			return line
		}
	}
	t.Fatalf("no log line %q", msg)
	return nil
}

// logUint is key of a log line as an unsigned integer.
func logUint(t *testing.T, line map[string]any, key string) uint64 {
	t.Helper()
	n, _ := line[key].(json.Number)
	v, err := strconv.ParseUint(n.String(), 10, 64)
	if err != nil {
		t.Fatalf("log line %q: %s = %v: %v", line["msg"], key, line[key], err)
	}
	return v
}

// metricValue is the value of an unlabelled metric in a Prometheus text
// exposition, "" when absent.
func metricValue(exposition, name string) string {
	for line := range strings.Lines(exposition) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
