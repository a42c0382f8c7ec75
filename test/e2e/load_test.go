//go:build load

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watchgate/watchgate/test/apiserver"
)

// TestLoad is `make load`, not part of `make test` (build tag load): one
// watchgate replica (bin/watchgate, a separate process) and a bare
// httputil.ReverseProxy (testdata/bareproxy) in front of a dedicated
// control plane, loopback only, every phase bounded in count and time. The
// load client is one or more loadclient processes (testdata/loadclient, at
// most LOAD_CLIENT_WATCHES (12,500) watches each, 500 per HTTP/2
// connection), as one agent: one service account, one budget with limits
// the load never reaches.
//
//  0. Warm-up: LOAD_WATCHES straight to the API server, opened and closed,
//     on each path's ConfigMaps.
//  1. Side by side, the same LOAD_WATCHES (10,000) through watchgate
//     without a memory limit (GOMEMLIMIT=off) and without a cap, through
//     watchgate as the chart runs it with the memory limit the sizing rule
//     gives that many watches
//     (LOAD_CHART_WATCHES_PER_GIB, 30,000; GOMEMLIMIT 90% of it,
//     --max-watches the count), and through the bare proxy. Each path
//     alone, in LOAD_ORDER: the time to open them all at once and the
//     proxy's CPU for it, then at rest RSS, Go heap in use, goroutines,
//     upstream connections and CPU; then its watches close. Then every
//     path opens them again, and LOAD_EVENTS (1,000) deliveries a second
//     for LOAD_EVENT_TIME (60s) in all go to each path in turn:
//     LOAD_EVENT_ROUNDS (20) rounds of a slice per path, the order rotating
//     each round, so that the API server's and the machine's drift falls on
//     every path alike (interleavedEvents). Each watch selects one
//     ConfigMap of its path by name across 100 namespaces, five watches to
//     a ConfigMap, and a writer stamps each update with its time; latency =
//     receive time − write time, and the proxy's CPU per event net of its
//     CPU at rest; a twentieth as many watches straight to the API server on
//     the same ConfigMaps give its own latency in the same slices.
//  2. The held replica: limit 1 GiB, GOMEMLIMIT 90% of it, --max-watches
//     LOAD_HOLD_WATCHES (30,000), which it is asked to hold for LOAD_HOLD
//     (2m) while 1% of them close and reopen each second; with
//     LOAD_PROFILE_DIR set, heap and goroutine profiles at 10,000 watches
//     on the way up.
//
// LOAD_EVENT_TIME=0 leaves out the events, LOAD_HOLD=0 the held replica;
// LOAD_APISERVER_GOMEMLIMIT is the API server's and etcd's GOMEMLIMIT. At
// 100,000 watches on a 24 GiB machine all three are needed (LOAD.md).
//
// It prints the tables and, with LOAD_WRITE=path, replaces the part of that
// file between <!-- load-N:begin --> and <!-- load-N:end -->, N the count
// of watches (a new block after the last when there is none). Speed is
// reported, never asserted.
func TestLoad(t *testing.T) {
	n := envInt("LOAD_WATCHES", 10000)
	hold := envDuration("LOAD_HOLD", 2*time.Minute)
	if os.Getenv("LOAD_HOLD") == "0" {
		hold = 0 // side by side only
	}
	holdN := envInt("LOAD_HOLD_WATCHES", 30000)
	events := envInt("LOAD_EVENTS", 1000)
	eventTime := envDuration("LOAD_EVENT_TIME", 60*time.Second)
	if os.Getenv("LOAD_EVENT_TIME") == "0" {
		eventTime = 0 // the opening only
	}
	rounds := envInt("LOAD_EVENT_ROUNDS", 20)
	if eventTime > 0 && (rounds < 1 || eventTime/time.Duration(rounds) < time.Second) {
		t.Fatalf("LOAD_EVENT_ROUNDS=%d: want at least 1, and LOAD_EVENT_TIME (%v) ÷ rounds at least 1s", rounds, eventTime)
	}
	perGiB := envInt("LOAD_CHART_WATCHES_PER_GIB", 30000)
	profileDir := os.Getenv("LOAD_PROFILE_DIR")
	root := apiserver.RepoRoot()
	bin := filepath.Join(root, "bin", "watchgate")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s missing: run `make build` (make load does)", bin)
	}
	bare, client := filepath.Join(t.TempDir(), "bareproxy"), filepath.Join(t.TempDir(), "loadclient")
	for out, pkg := range map[string]string{bare: "./testdata/bareproxy", client: "./testdata/loadclient"} {
		if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, b)
		}
	}
	load0 := loadAvg()
	started := time.Now().UTC()

	// The API server's own limits stay at their defaults, but for
	// priority and fairness: the load identity's tens of thousands of
	// watches, opened at once, would wait in (and be refused by) its
	// priority level's queues, which measures the API server, not the
	// proxies. Watches are long-running requests, which
	// --max-requests-inflight does not count.
	//
	// LOAD_APISERVER_GOMEMLIMIT, when set, is the GOMEMLIMIT of the test
	// bed's kube-apiserver and etcd (their environment when they start;
	// nothing started after them sees it): at 100,000 watches the API
	// server's heap between collections, not what it holds, is what leaves
	// a 24 GiB machine no room for the bare proxy. It is the same for
	// every path, the warm-ups straight to the API server included.
	apiMemLimit := os.Getenv("LOAD_APISERVER_GOMEMLIMIT")
	restoreEnv := setEnv("GOMEMLIMIT", apiMemLimit)
	e, err := apiserver.Start(apiserver.Options{
		CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")},
		Args:              map[string]string{"enable-priority-and-fairness": "false"},
	})
	restoreEnv()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ctx := context.Background()
	agentNS := uniqueName("load")
	sa, err := e.ServiceAccount(ctx, agentNS, "agent")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Grant(ctx, sa, readWatch("configmaps")); err != nil {
		t.Fatal(err)
	}
	// One budget governs the load identity, with limits the load never
	// reaches and no backoff: the engine decides and tracks every watch,
	// and a few failed opens (an identity's watches beyond its 64 backoff
	// keys share one) do not turn the rest away. 100,000 is the most a
	// budget allows: at LOAD_WATCHES=100000 a replica's opening takes the
	// whole burst, which has refilled by its next opening (the other
	// paths open and rest in between, over a minute).
	budget := (`{"apiVersion":"watchgate.io/v1alpha1","kind":"WatchBudget","metadata":{"name":"load"},
"spec":{"precedence":10,"enforcement":"Enforce","limits":{"watchOpensPerMinute":100000,"watchBurst":100000,"maxConcurrentWatches":100000},
"backoff":{"initialDelaySeconds":0}}}`)
	if err := kubectlApply(ctx, e, budget); err != nil {
		t.Fatal(err)
	}
	// Each path's watches select ConfigMaps of their own, so that a
	// write reaches only the path whose turn it is.
	groups := max(1, n/5)
	var objs [3]loadObjects
	var shapes [3]clientShape
	for i := range objs {
		objs[i] = loadObjects{prefix: fmt.Sprintf("%s-p%d-", agentNS, i), groups: groups, namespaces: min(100, groups)}
		objs[i].create(t, ctx, e.Clientset)
		shapes[i] = clientShape{token: sa.Token, prefix: objs[i].prefix, groups: objs[i].groups, namespaces: objs[i].namespaces}
	}

	// 0. The same watches straight to the API server, opened and closed,
	// so that the first path measured does not pay alone for the API
	// server's first opening of them.
	for i := range shapes {
		f := startFleet(t, client, strings.TrimRight(e.Config.Host, "/"), n, shapes[i])
		o := f.open(t, n)
		t.Logf("warm-up %d, straight to the API server: opened %d of %d in %v (refused %v)", i, o.opened, n, o.took, o.refused)
		if o.opened == 0 {
			t.Fatalf("the warm-up opened no watch straight to the API server at %s", e.Config.Host)
		}
		f.close(t, o.opened)
		f.stop()
	}

	// 1. Side by side, the paths by number: 0 watchgate without limits,
	// 1 as charted, 2 the bare proxy. Each opens its watches alone, in
	// LOAD_ORDER, and closes them; then all three open them again for the
	// events, which go to each in turn.
	chartLimit := int64((n+perGiB-1)/perGiB) << 30
	var procs [3]*process
	procs[0] = startWatchgate(t, e, bin, []string{"GOMEMLIMIT=off"}, "--max-watches=0", "--watch-opens-per-identity-per-second=0")
	procs[1] = startWatchgate(t, e, bin, []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", chartLimit*9/10>>20)},
		fmt.Sprintf("--max-watches=%d", n), fmt.Sprintf("--max-watches-per-identity=%d", n), "--watch-opens-per-identity-per-second=0")
	procs[2] = startBare(t, e, bare)
	names := [3]string{"watchgate-uncapped", "watchgate-charted", "bare"}
	var runs [3]loadRun
	order := loadOrder(t, os.Getenv("LOAD_ORDER"))
	for _, i := range order {
		runs[i] = measureOpen(t, procs[i], startFleet(t, client, procs[i].url, n, shapes[i]), n)
		if eventTime == 0 {
			procs[i].stop() // what it holds goes back before the next path opens
		}
	}
	runs[0].name = "watchgate, no GOMEMLIMIT, no cap"
	runs[1].name = fmt.Sprintf("watchgate as charted: limit %d GiB, GOMEMLIMIT %d MiB, --max-watches %d", chartLimit>>30, chartLimit*9/10>>20, n)
	runs[2].name = "bare httputil.ReverseProxy"
	// Then all three open them again for the events (LOAD_EVENT_TIME=0
	// leaves them out: at 100,000 watches the three paths' watches at once
	// are more than this machine holds).
	var paths []*eventPath
	if eventTime > 0 {
		for _, i := range order {
			f := startFleet(t, client, procs[i].url, n, shapes[i])
			o := f.open(t, n)
			cn := max(1, n/20)
			cf := startFleet(t, client, strings.TrimRight(e.Config.Host, "/"), cn, shapes[i])
			if co := cf.open(t, cn); co.opened < cn {
				t.Logf("control of %s: opened %d of %d watches straight to the API server (refused %v)", names[i], co.opened, cn, co.refused)
			}
			t.Logf("%s: opened %d of %d again for the events", names[i], o.opened, n)
			paths = append(paths, &eventPath{p: procs[i], watches: f, opened: o.opened, objs: objs[i], control: cf, name: names[i], run: &runs[i]})
		}
		interleavedEvents(t, ctx, e, paths, events, eventTime, rounds, profileDir)
	}
	for _, ep := range paths {
		ep.watches.close(t, ep.opened)
		ep.watches.stop()
		ep.control.stop()
	}
	for _, p := range procs {
		p.stop()
	}

	// 2. The held replica.
	var h heldReplica
	if hold > 0 {
		h = holdReplica(t, e, bin, client, shapes[0], holdN, hold, profileDir)
	}

	load1 := loadAvg()
	commit, _ := exec.Command("git", "-C", root, "describe", "--always", "--dirty").Output()
	var b strings.Builder
	var extra string
	if profileDir != "" {
		extra += " LOAD_PROFILE_DIR=…"
	}
	if apiMemLimit != "" {
		extra += " LOAD_APISERVER_GOMEMLIMIT=" + apiMemLimit
	}
	fmt.Fprintf(&b, "Command: `make load` (LOAD_WATCHES=%d LOAD_EVENTS=%d LOAD_EVENT_TIME=%v LOAD_EVENT_ROUNDS=%d LOAD_HOLD_WATCHES=%d LOAD_HOLD=%v LOAD_CHART_WATCHES_PER_GIB=%d LOAD_ORDER=%s%s); %s; commit %s; load average %s at the start, %s at the end; %s.\n\n",
		n, events, eventTime, rounds, holdN, hold, perGiB, strings.Trim(strings.Join(strings.Fields(fmt.Sprint(order)), ","), "[]"), extra,
		started.Format("2006-01-02 15:04 UTC"), strings.TrimSpace(string(commit)), load0, load1, machine())
	b.WriteString(sideBySide(runs, n, eventTime > 0))
	if hold > 0 {
		b.WriteString("\n")
		b.WriteString(h.table())
	}
	fmt.Println(b.String())
	if out := os.Getenv("LOAD_WRITE"); out != "" {
		if err := writeLoadBlock(out, n, b.String()); err != nil {
			t.Error(err)
		}
	}
}

// setEnv sets the environment variable name to value (nothing when value
// is empty) and returns what puts it back.
func setEnv(name, value string) (restore func()) {
	if value == "" {
		return func() {}
	}
	old, had := os.LookupEnv(name)
	_ = os.Setenv(name, value)
	return func() {
		if had {
			_ = os.Setenv(name, old)
		} else {
			_ = os.Unsetenv(name)
		}
	}
}
