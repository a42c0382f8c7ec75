//go:build load

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watchgate/watchgate/test/apiserver"
)

// process is a proxy under measurement, in its own process: watchgate
// (bin/watchgate) or the bare proxy (testdata/bareproxy).
type process struct {
	cmd      *exec.Cmd
	url      string
	pid      int
	statsURL string // watchgate: /metrics; bare proxy: goroutines and heap
	pprof    string // watchgate: its --pprof-bind-address
	apiPort  int    // the API server's port
	log      string // watchgate: the file of its output
	bare     bool
	stopped  bool
}

// sample is what a process says of itself at one moment.
type sample struct {
	rss, heapInuse, stackInuse uint64
	// guarded is watchgate_proxy_memory_in_use_bytes: the memory the watch
	// guard counted at its last sample (watchgate only).
	guarded    uint64
	goroutines int
	// upstream is watchgate_proxy_upstream_connections for watchgate, the
	// count of its TCP connections to the API server for the bare proxy.
	upstream int
}

func startWatchgate(t *testing.T, e *apiserver.Env, bin string, env []string, args ...string) *process {
	t.Helper()
	addrs := make([]string, 4)
	for i := range addrs {
		a, err := apiserver.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = a
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig=" + e.Kubeconfig, "--proxy-bind-address=" + addrs[0],
		"--metrics-bind-address=" + addrs[1], "--metrics-secure=false", "--health-probe-bind-address=" + addrs[2],
		"--pprof-bind-address=" + addrs[3], "--pod-name=load"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "watchgate.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, url: "https://" + addrs[0], pid: cmd.Process.Pid, statsURL: "http://" + addrs[1] + "/metrics", pprof: addrs[3], apiPort: apiPort(t, e), log: logFile.Name()}
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
	p := &process{cmd: cmd, pid: cmd.Process.Pid, bare: true, apiPort: apiPort(t, e)}
	t.Cleanup(p.stop)
	sc := bufio.NewScanner(out)
	for (p.url == "" || p.statsURL == "") && sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "serving":
			p.url = "https://" + f[1]
		case len(f) == 2 && f[0] == "stats":
			p.statsURL = "http://" + f[1] + "/"
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

// sampleAfter reads RSS from /proc, and goroutines, heap and stacks in use
// and upstream connections from the process, after a garbage collection in
// the process when gc is set (watchgate's through its pprof server), so
// that heap in use counts what is live.
func (p *process) sampleAfter(gc bool) sample {
	var s sample
	statsURL := p.statsURL
	if gc && p.bare {
		statsURL += "?gc=1"
	}
	if gc && !p.bare {
		if resp, err := http.Get("http://" + p.pprof + "/debug/pprof/heap?gc=1"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	s.rss = rssOf(p.pid)
	resp, err := http.Get(statsURL)
	if err != nil {
		return s
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if p.bare {
		f := strings.Fields(string(body))
		if len(f) == 3 {
			s.goroutines, _ = strconv.Atoi(f[0])
			s.heapInuse, _ = strconv.ParseUint(f[1], 10, 64)
			s.stackInuse, _ = strconv.ParseUint(f[2], 10, 64)
		}
		s.upstream = p.socketsTo(p.apiPort)
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
		case "go_memstats_stack_inuse_bytes":
			s.stackInuse = uint64(v)
		case "watchgate_proxy_memory_in_use_bytes":
			s.guarded = uint64(v)
		case "watchgate_proxy_upstream_connections":
			s.upstream = int(v)
		}
	}
	return s
}

// logLines answers the first k lines of watchgate's output that hold s.
func (p *process) logLines(s string, k int) []string {
	data, err := os.ReadFile(p.log)
	if err != nil || p.log == "" {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, s) && len(out) < k {
			out = append(out, l)
		}
	}
	return out
}

func apiPort(t *testing.T, e *apiserver.Env) int {
	t.Helper()
	u, err := url.Parse(e.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("API server URL %s: no port", e.Config.Host)
	}
	return port
}

// socketsTo counts p's established TCP connections to port: the sockets
// among its open files that /proc/net/tcp{,6} list with that remote port.
func (p *process) socketsTo(port int) int {
	dir := fmt.Sprintf("/proc/%d/fd", p.pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, _ := os.Readlink(filepath.Join(dir, fd.Name()))
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	n := 0
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, _ := os.ReadFile(file)
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "01" { // ESTABLISHED
				continue
			}
			_, remotePort, _ := strings.Cut(f[2], ":")
			if v, err := strconv.ParseInt(remotePort, 16, 32); err == nil && int(v) == port && inodes[f[9]] {
				n++
			}
		}
	}
	return n
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

// rssOf reads the resident set size of process pid from /proc, 0 when it
// cannot.
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

// peakRSS samples p's RSS (from /proc, so that sampling takes no CPU
// from p) every interval until the returned function is first called; it
// answers the highest sample, every time it is called.
func (p *process) peakRSS(every time.Duration) func() uint64 {
	var peak atomic.Uint64
	stop := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		for {
			if r := rssOf(p.pid); r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-stop:
				return
			case <-time.After(every):
			}
		}
	})
	return sync.OnceValue(func() uint64 {
		close(stop)
		sampling.Wait()
		return peak.Load()
	})
}

// profiles saves watchgate's heap and goroutine profiles into dir as
// <name>.heap.pb.gz and <name>.goroutine.txt and answers their top entries:
// the largest in-use allocation sites (go tool pprof -top) and the stacks
// most goroutines wait in.
func (p *process) profiles(dir, name string) (heapTop, goroutineTop string, err error) {
	heapFile := filepath.Join(dir, name+".heap.pb.gz")
	if err := fetchTo("http://"+p.pprof+"/debug/pprof/heap?gc=1", heapFile); err != nil {
		return "", "", err
	}
	grFile := filepath.Join(dir, name+".goroutine.txt")
	if err := fetchTo("http://"+p.pprof+"/debug/pprof/goroutine?debug=1", grFile); err != nil {
		return "", "", err
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=6", "-sample_index=inuse_space", heapFile).CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("go tool pprof: %w: %s", err, out)
	}
	heapTop = pprofTop(string(out), 5)
	text, err := os.ReadFile(grFile)
	if err != nil {
		return "", "", err
	}
	return heapTop, goroutineStacks(string(text), 4), nil
}

func fetchTo(u, file string) error {
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// pprofTop turns `go tool pprof -top` output into "function flat (flat%)",
// the first k entries.
func pprofTop(out string, k int) string {
	var entries []string
	started := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && f[0] == "flat" {
			started = true
			continue
		}
		if !started || len(f) < 6 || len(entries) == k {
			continue
		}
		entries = append(entries, fmt.Sprintf("`%s` %s (%s)", shortFunc(strings.Join(f[5:], " ")), f[0], f[1]))
	}
	return strings.Join(entries, ", ")
}

// goroutineStacks answers the k stacks most goroutines are in, from a
// debug=1 goroutine profile, each named by a frame and its count.
func goroutineStacks(text string, k int) string {
	type stack struct {
		n     int
		frame string
	}
	var stacks []stack
	for _, block := range strings.Split(text, "\n\n") {
		lines := strings.Split(strings.TrimSpace(block), "\n")
		if len(lines) < 2 {
			continue
		}
		n := 0
		if _, err := fmt.Sscanf(lines[0], "%d @", &n); err != nil {
			continue
		}
		// The innermost frame of a module (its path's first element
		// has a dot), else the innermost outside the runtime.
		frame, fallback := "", ""
		for _, l := range lines[1:] {
			f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(l), "#"))
			if len(f) < 3 {
				continue
			}
			fn, _, _ := strings.Cut(f[1], "+0x")
			if first, _, _ := strings.Cut(fn, "/"); strings.Contains(first, ".") && strings.Contains(fn, "/") {
				frame = fn
				break
			}
			if fallback == "" && !strings.HasPrefix(fn, "runtime.") && !strings.HasPrefix(fn, "sync.") && !strings.HasPrefix(fn, "internal/") {
				fallback = fn
			}
		}
		if frame == "" {
			frame = fallback
		}
		stacks = append(stacks, stack{n, frame})
	}
	sort.Slice(stacks, func(i, j int) bool { return stacks[i].n > stacks[j].n })
	var out []string
	for _, s := range stacks[:min(k, len(stacks))] {
		out = append(out, fmt.Sprintf("`%s` %d", shortFunc(s.frame), s.n))
	}
	return strings.Join(out, ", ")
}

// shortFunc drops a function's import path, keeping package.Func.
func shortFunc(fn string) string {
	if i := strings.LastIndexByte(fn, '/'); i >= 0 {
		return fn[i+1:]
	}
	return fn
}

// cpuProfile writes p's CPU profile over d to file (watchgate only).
func (p *process) cpuProfile(file string, d time.Duration) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	return fetchTo(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.pprof, int(d.Seconds())), file)
}

// apiServerProcess is the API server of e as a process, to read its CPU:
// the kube-apiserver whose command line holds its --secure-port.
func apiServerProcess(t *testing.T, e *apiserver.Env) *process {
	t.Helper()
	port := fmt.Sprintf("--secure-port=%d", apiPort(t, e))
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if strings.HasSuffix(args[0], "kube-apiserver") && slices.Contains(args, port) {
			pid, _ := strconv.Atoi(filepath.Base(dir))
			return &process{pid: pid}
		}
	}
	t.Logf("no kube-apiserver process with %s found: its CPU reads 0", port)
	return &process{pid: -1}
}

// apiServerCPUProfile writes the API server's CPU profile over d to file.
func apiServerCPUProfile(ctx context.Context, e *apiserver.Env, file string, d time.Duration) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	raw, err := e.Clientset.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(int(d.Seconds()))).Timeout(d + time.Minute).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("API server CPU profile: %w", err)
	}
	return os.WriteFile(file, raw, 0o644)
}
