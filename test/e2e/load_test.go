//go:build load

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/test/apiserver"
)

// TestLoad is `make load`, not part of `make test` (build tag load): one
// watchgate replica (bin/watchgate, a separate process) and a bare
// httputil.ReverseProxy (testdata/bareproxy) in front of a dedicated
// control plane, loopback only, every phase bounded in count and time:
//
//  1. LOAD_WATCHES (10,000) concurrent idle watches through watchgate
//     without GOMEMLIMIT and without a cap, then through the bare proxy:
//     RSS (/proc), goroutines, CPU while idle.
//  2. watchgate as the chart runs it (GOMEMLIMIT 90% of 512Mi, default
//     --max-watches) held at its maximum for LOAD_HOLD (2m) while watches
//     close and reopen; then one more watch than the maximum.
//  3. watchgate with a small GOMEMLIMIT and no cap: watches open until the
//     memory guard refuses, before the limit.
//
// It prints a table and, with LOAD_WRITE=path, replaces the part of that
// file between <!-- load:begin --> and <!-- load:end -->.
func TestLoad(t *testing.T) {
	n := envInt("LOAD_WATCHES", 10000)
	hold := envDuration("LOAD_HOLD", 2*time.Minute)
	root := apiserver.RepoRoot()
	bin := filepath.Join(root, "bin", "watchgate")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s missing: run `make build` (make load does)", bin)
	}
	bare := filepath.Join(t.TempDir(), "bareproxy")
	if out, err := exec.Command("go", "build", "-o", bare, "./testdata/bareproxy").CombinedOutput(); err != nil {
		t.Fatalf("build bareproxy: %v\n%s", err, out)
	}
	load0 := loadAvg()
	started := time.Now().UTC()

	e, err := apiserver.Start(apiserver.Options{
		CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")},
		// Room for every watch on few upstream connections.
		Args: map[string]string{"http2-max-streams-per-connection": "2000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ctx := context.Background()
	ns := uniqueName("load")
	sa, err := e.ServiceAccount(ctx, ns, "agent")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Grant(ctx, sa, readWatch("configmaps")); err != nil {
		t.Fatal(err)
	}
	cm, err := e.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "anchor"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// One budget governs the load identity, with limits the load never
	// reaches: the engine decides and tracks every watch.
	budget := (`{"apiVersion":"watchgate.io/v1alpha1","kind":"WatchBudget","metadata":{"name":"load"},
"spec":{"precedence":10,"enforcement":"Enforce","limits":{"watchOpensPerMinute":100000,"watchBurst":100000,"maxConcurrentWatches":100000}}}`)
	if err := kubectlApply(ctx, e, budget); err != nil {
		t.Fatal(err)
	}
	path := "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=3600&resourceVersion=" + cm.ResourceVersion

	var rows []string
	row := func(format string, args ...any) {
		r := fmt.Sprintf(format, args...)
		rows = append(rows, r)
		t.Log(r)
	}

	// 1. n idle watches: watchgate as the old figures were taken (no
	// GOMEMLIMIT, no cap), then the bare proxy.
	{
		p := startWatchgate(t, e, bin, nil, "--max-watches=0", "--watch-opens-per-identity-per-second=0")
		base := p.sample()
		ws := openWatches(t, p.url, sa.Token, path, n, nil)
		if ws.opened() != n {
			t.Fatalf("opened %d of %d watches through watchgate (refused %v)", ws.opened(), n, ws.refusals())
		}
		time.Sleep(10 * time.Second)
		cpu0 := p.cpu()
		time.Sleep(30 * time.Second)
		idleCPU := (p.cpu() - cpu0) / 30
		s := p.sample()
		row("| watchgate, %d idle watches, no GOMEMLIMIT | %d MiB | %.1f KiB | %d | %d MiB | %.3f cores |",
			n, s.rss>>20, float64(s.rss-base.rss)/1024/float64(n), s.goroutines, s.heapInuse>>20, idleCPU)
		ws.close()
		p.stop()
	}
	{
		b := startBare(t, e, bare)
		base := b.sample()
		ws := openWatches(t, b.url, sa.Token, path, n, nil)
		if ws.opened() != n {
			t.Fatalf("opened %d of %d watches through the bare proxy", ws.opened(), n)
		}
		time.Sleep(10 * time.Second)
		cpu0 := b.cpu()
		time.Sleep(30 * time.Second)
		idleCPU := (b.cpu() - cpu0) / 30
		s := b.sample()
		row("| bare httputil.ReverseProxy, %d idle watches | %d MiB | %.1f KiB | %d | – | %.3f cores |",
			n, s.rss>>20, float64(s.rss-base.rss)/1024/float64(n), s.goroutines, idleCPU)
		ws.close()
		b.stop()
	}

	// 2. The chart's replica held at its maximum.
	const limit = 512 << 20
	goMemLimit := limit * 9 / 10
	{
		max := proxy.DefaultMaxWatches
		// One service account opens them all: lift its ceiling to the cap.
		p := startWatchgate(t, e, bin, []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", goMemLimit>>20)}, fmt.Sprintf("--max-watches-per-identity=%d", max), "--watch-opens-per-identity-per-second=0")
		ws := openWatches(t, p.url, sa.Token, path, max, nil)
		if ws.opened() != max {
			t.Errorf("opened %d of the %d watches the default cap allows (refused %v): the memory guard fires below the cap; lower DefaultMaxWatches",
				ws.opened(), max, ws.refusals())
		}
		var peak atomic.Uint64
		stopSampling := make(chan struct{})
		var sampling sync.WaitGroup
		sampling.Go(func() {
			for {
				if r := p.sample().rss; r > peak.Load() {
					peak.Store(r)
				}
				select {
				case <-stopSampling:
					return
				case <-time.After(time.Second):
				}
			}
		})
		// Churn: every second, the oldest 1% of the watches end and as many
		// open; the oldest first lived past the short-watch threshold (10s).
		time.Sleep(11 * time.Second)
		churned := 0
		deadline := time.Now().Add(hold)
		for time.Now().Before(deadline) {
			k := max / 100
			ws.closeSome(k)
			more := openWatches(t, p.url, sa.Token, path, k, ws)
			churned += more.opened()
			time.Sleep(time.Second)
		}
		heldRefusals := ws.refusals()
		// Back to the cap (a reopen may have met a place not yet
		// released), then beyond it.
		openWatches(t, p.url, sa.Token, path, max-ws.opened(), ws)
		over := openWatches(t, p.url, sa.Token, path, 10, ws)
		close(stopSampling)
		sampling.Wait()
		s := p.sample()
		row("| watchgate as charted (limit 512 MiB, GOMEMLIMIT %d MiB, --max-watches %d), held %v at the cap, %d watches reopened | peak %d MiB | – | %d | %d MiB | refused while held: %v; 10 more watches: %v |",
			goMemLimit>>20, max, hold, churned, peak.Load()>>20, s.goroutines, s.heapInuse>>20, heldRefusals, over.refusals())
		if peak.Load() >= limit {
			t.Errorf("peak RSS %d MiB reached the pod limit %d MiB", peak.Load()>>20, limit>>20)
		}
		if over.refusals()[proxy.GuardMaxWatches] != 10 {
			t.Errorf("10 watches over the cap: refused %v, want 10 × %s", over.refusals(), proxy.GuardMaxWatches)
		}
		ws.close()
		p.stop()
	}

	// 3. The memory guard refuses before a (small) limit is reached.
	{
		const small = 128 << 20
		p := startWatchgate(t, e, bin, []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", small>>20)}, "--max-watches=0", "--watch-opens-per-identity-per-second=0")
		ws := openWatches(t, p.url, sa.Token, path, n, nil)
		s := p.sample()
		row("| watchgate, GOMEMLIMIT %d MiB, no cap, %d watches tried | %d MiB | – | %d | %d MiB | admitted %d, refused %v |",
			small>>20, n, s.rss>>20, s.goroutines, s.heapInuse>>20, ws.opened(), ws.refusals())
		if ws.refusals()[proxy.GuardMemoryHighWater] == 0 {
			t.Errorf("no watch refused for memory under GOMEMLIMIT %d MiB with %d watches", small>>20, n)
		}
		ws.close()
		p.stop()
	}

	load1 := loadAvg()
	commit, _ := exec.Command("git", "-C", root, "describe", "--always", "--dirty").Output()
	var b strings.Builder
	fmt.Fprintf(&b, "Command: `make load` (LOAD_WATCHES=%d LOAD_HOLD=%v); %s; commit %s; load average %s at the start, %s at the end; %s.\n\n",
		n, hold, started.Format("2006-01-02 15:04 UTC"), strings.TrimSpace(string(commit)), load0, load1, machine())
	b.WriteString("| run | RSS | RSS per watch | goroutines | heap in use | CPU idle / notes |\n|---|---|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString(r + "\n")
	}
	fmt.Println(b.String())
	if out := os.Getenv("LOAD_WRITE"); out != "" {
		if err := replaceBetweenMarkers(out, b.String()); err != nil {
			t.Error(err)
		}
	}
}

// process is a proxy under measurement, in its own process.
type process struct {
	cmd      *exec.Cmd
	url      string
	pid      int
	statsURL string // watchgate: /metrics; bare proxy: /goroutines
	bare     bool
	stopped  bool
}

type sample struct {
	rss, heapInuse uint64
	goroutines     int
}

func startWatchgate(t *testing.T, e *apiserver.Env, bin string, env []string, args ...string) *process {
	t.Helper()
	addrs := make([]string, 3)
	for i := range addrs {
		a, err := apiserver.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = a
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig=" + e.Kubeconfig, "--proxy-bind-address=" + addrs[0],
		"--metrics-bind-address=" + addrs[1], "--metrics-secure=false", "--health-probe-bind-address=" + addrs[2], "--pod-name=load"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "watchgate.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, url: "https://" + addrs[0], pid: cmd.Process.Pid, statsURL: "http://" + addrs[1] + "/metrics"}
	t.Cleanup(p.stop)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get("http://" + addrs[2] + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile.Name())
			t.Fatalf("watchgate not ready after 2m:\n%s", log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func startBare(t *testing.T, e *apiserver.Env, bin string) *process {
	t.Helper()
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, e.Config.CAData, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--upstream="+e.Config.Host, "--ca-file="+caFile)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, pid: cmd.Process.Pid, bare: true}
	t.Cleanup(p.stop)
	sc := bufio.NewScanner(out)
	for (p.url == "" || p.statsURL == "") && sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "serving":
			p.url = "https://" + f[1]
		case len(f) == 2 && f[0] == "stats":
			p.statsURL = "http://" + f[1] + "/goroutines"
		}
	}
	if p.url == "" || p.statsURL == "" {
		t.Fatal("bareproxy did not say where it serves")
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return p
}

func (p *process) stop() {
	if p.stopped {
		return
	}
	p.stopped = true
	_ = p.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// rssOf is the resident set size of process pid, from /proc; 0 when it
// cannot be read.
func rssOf(pid int) uint64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// sample reads RSS from /proc and goroutines and heap from the process.
func (p *process) sample() sample {
	s := sample{rss: rssOf(p.pid)}
	resp, err := http.Get(p.statsURL)
	if err != nil {
		return s
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if p.bare {
		s.goroutines, _ = strconv.Atoi(strings.TrimSpace(string(body)))
		return s
	}
	for _, line := range strings.Split(string(body), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "go_goroutines":
			s.goroutines = int(v)
		case "go_memstats_heap_inuse_bytes":
			s.heapInuse = uint64(v)
		}
	}
	return s
}

// cpu is the process's user+system CPU time so far, in seconds.
func (p *process) cpu() float64 {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	if err != nil {
		return 0
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// watchSet is a set of open watches held by this process.
type watchSet struct {
	mu       sync.Mutex
	open     []context.CancelFunc
	refused  map[string]int
	clients  []*http.Client
	nextConn int
	wg       sync.WaitGroup
}

func (w *watchSet) opened() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.open)
}

func (w *watchSet) refusals() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.refused {
		out[k] = v
	}
	return out
}

// closeSome ends the k oldest watches: they lived longer than a budget's
// short-watch threshold, so their ends are normal, as a client's
// reconnect after the API server's watch timeout is.
func (w *watchSet) closeSome(k int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k = min(k, len(w.open))
	for _, c := range w.open[:k] {
		c()
	}
	w.open = append(w.open[:0:0], w.open[k:]...)
}

func (w *watchSet) close() {
	w.mu.Lock()
	for _, c := range w.open {
		c()
	}
	w.open = nil
	w.mu.Unlock()
	w.wg.Wait()
	for _, c := range w.clients {
		c.CloseIdleConnections()
	}
}

// openWatches opens n watches of path through url with token, 32 at a
// time, over HTTP/2 connections of at most 500 streams each; into (and
// returned) when into is set, else into a new set. A watch is open once
// its response headers arrived with 200; a refusal is counted by the
// reason in X-Watchgate-Decision (or the HTTP status). It gives up after
// 10 minutes.
func openWatches(t *testing.T, url, token, path string, n int, into *watchSet) *watchSet {
	t.Helper()
	ws := into
	if ws == nil {
		ws = &watchSet{refused: map[string]int{}}
		for range n/500 + 1 {
			ws.clients = append(ws.clients, &http.Client{Transport: &http.Transport{
				TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // loopback, a throwaway certificate
				ForceAttemptHTTP2: true,
			}})
		}
	}
	before := ws.opened()
	refused := map[string]int{} // this call's, under ws.mu
	deadline := time.Now().Add(10 * time.Minute)
	jobs := make(chan struct{})
	var openers sync.WaitGroup
	for range 32 {
		openers.Go(func() {
			for range jobs {
				ws.mu.Lock()
				c := ws.clients[ws.nextConn%len(ws.clients)]
				ws.nextConn++
				ws.mu.Unlock()
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+path, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := c.Do(req)
				if err != nil {
					cancel()
					ws.mu.Lock()
					refused["error"]++
					ws.mu.Unlock()
					continue
				}
				if resp.StatusCode != http.StatusOK {
					reason := strconv.Itoa(resp.StatusCode)
					if d := resp.Header.Get(proxy.DecisionHeader); d != "" {
						if _, r, ok := strings.Cut(d, "reason="); ok {
							reason, _, _ = strings.Cut(r, ";")
						}
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					cancel()
					ws.mu.Lock()
					refused[reason]++
					ws.mu.Unlock()
					continue
				}
				ws.mu.Lock()
				ws.open = append(ws.open, cancel)
				ws.mu.Unlock()
				ws.wg.Go(func() {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				})
			}
		})
	}
	for i := 0; i < n && time.Now().Before(deadline); i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	openers.Wait()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if into == nil {
		ws.refused = refused
		return ws
	}
	for k, v := range refused {
		ws.refused[k] += v
	}
	// A top-up reports what it opened and what was refused this time.
	return &watchSet{open: make([]context.CancelFunc, len(ws.open)-before), refused: refused}
}

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
