package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/watchgate/watchgate/test/apiserver"
)

// budget decides every watch and list of the bench client and rejects none:
// limits far above what the harness asks for, Enforce (not DryRun, so the
// enforcing path is measured), backoff off (the harness closes its watches
// at once, which a backoff would count as failures).
const budget = `apiVersion: watchgate.io/v1alpha1
kind: WatchBudget
metadata:
  name: bench
spec:
  precedence: 100
  subjects:
  - kind: ServiceAccount
    namespace: bench
    name: client
  enforcement: Enforce
  limits:
    watchOpensPerMinute: 100000
    watchBurst: 100000
    maxConcurrentWatches: 100000
    listsPerMinute: 100000
    listBurst: 100000
  backoff:
    initialDelaySeconds: 0
    maxDelaySeconds: 0
  staleVersions:
    action: Reject
`

const (
	nsGet    = "bench"        // one config map, the GET target; watch opens
	nsIdle   = "bench-idle"   // empty: idle watches
	nsReplay = "bench-replay" // the replayed objects
)

func run(ctx context.Context, c config) error {
	if _, err := os.Stat(c.watchgate); err != nil {
		return fmt.Errorf("%s: %w (run `make build`)", c.watchgate, err)
	}
	started := time.Now().UTC()
	loadStart := loadAverage()
	tmp, err := os.MkdirTemp("", "watchgate-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	step("Starting kube-apiserver %s and etcd (watch cache on)", apiserver.KubeVersion)
	env, err := apiserver.Start(apiserver.Options{CRDDirectoryPaths: []string{filepath.Join(apiserver.RepoRoot(), "config", "crd", "bases")}})
	if err != nil {
		return err
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop the test bed:", err)
		}
	}()

	sa, err := env.ServiceAccount(ctx, nsGet, "client")
	if err != nil {
		return err
	}
	if err := env.Grant(ctx, sa, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}); err != nil {
		return err
	}
	step("Creating %d config maps to replay, and the GET target", c.objects)
	rvIdle, rvGet, err := seed(ctx, env, c.objects)
	if err != nil {
		return err
	}

	targets, stop, err := startTargets(ctx, env, c.watchgate, sa.Token, tmp)
	defer stop()
	if err != nil {
		return err
	}
	direct, bare, wg := targets[0], targets[1], targets[2]

	step("Warming up each path (token review cache, connections)")
	for _, t := range targets {
		for range 20 {
			if _, err := t.get(ctx, objectPath(nsGet, "target")); err != nil {
				return err
			}
			if _, err := t.watchOpen(ctx, collectionPath(nsGet), rvGet); err != nil {
				return err
			}
		}
		if _, _, err := t.replay(ctx, collectionPath(nsReplay), mediaJSON); err != nil {
			return err
		}
	}

	res := newResults(targets)
	step("Memory: %d idle watches through each proxy, RSS before and after (settled)", c.idle)
	for _, t := range []*target{bare, wg} {
		if err := measureIdle(ctx, t, res, nsIdle, rvIdle, c.idle, c.memProfiles); err != nil {
			return err
		}
	}
	step("CPU at rest: each proxy's own background work over %s, nothing asked of it", restFor)
	if err := measureAtRest([]*target{bare, wg}, res, restFor); err != nil {
		return err
	}

	step("%d rounds; each path per round: %d GETs, %d watch opens, %d JSON and %d protobuf replays of %d objects",
		c.rounds, c.gets, c.opens, c.replays, c.replays, c.objects)
	// Both proxies are profiled over the same span: the bare proxy's
	// profile, to compare with, goes to <file>.bare.
	profiled := make(chan error, 2)
	if c.cpuProfile != "" {
		go func() { profiled <- profile(ctx, wg.pprof, c.profileFor, c.cpuProfile) }()
		go func() { profiled <- profile(ctx, bare.pprof, c.profileFor, c.cpuProfile+".bare") }()
	} else {
		profiled <- nil
		profiled <- nil
	}
	for r := range c.rounds {
		for _, phase := range phases {
			for i := range targets {
				if err := phase(ctx, targets[(r+i)%len(targets)], res, c, rvGet); err != nil {
					return err
				}
			}
		}
		fmt.Printf("    round %d/%d done\n", r+1, c.rounds)
	}
	if err := errors.Join(<-profiled, <-profiled); err != nil {
		return err
	}
	if c.cpuProfile != "" {
		fmt.Printf("    CPU profiles: watchgate %s, bare proxy %s.bare\n", c.cpuProfile, c.cpuProfile)
	}
	if held, opens, err := heldWatches(ctx, wg.metrics); err != nil {
		fmt.Println("    cannot read watchgate's metrics:", err)
	} else {
		// A watch waits while another from the same version asks the API
		// server (coalescer); sequential opens should not.
		fmt.Printf("    watchgate held %.0f of %.0f watch opens for another watch's verdict\n", held, opens)
	}

	rep := report{
		command:   "make bench",
		started:   started,
		machine:   fmt.Sprintf("%d cores, %s, load average %s at start, %s at end", numCPU(), machine(), loadStart, loadAverage()),
		commit:    commit(apiserver.RepoRoot()),
		config:    c,
		results:   res,
		direct:    direct.name,
		bare:      bare.name,
		watchgate: wg.name,
	}
	table := rep.markdown()
	fmt.Println()
	fmt.Print(table)
	if c.write {
		if err := writeBlock(c.benchmarks, table); err != nil {
			return err
		}
		fmt.Println("\nwritten to", c.benchmarks)
	}
	return nil
}

// restFor is how long measureAtRest watches the idle proxies: several of
// watchgate's periodic tasks (readiness probe, sweeps, status entries).
const restFor = 20 * time.Second

// seed creates the namespaces and objects and returns valid, explicit
// resourceVersions to watch the idle and the GET namespace from. They are
// taken after the last write, so they stay inside the watch cache's window
// for the whole run (nothing else writes config maps).
func seed(ctx context.Context, env *apiserver.Env, objects int) (rvIdle, rvGet string, err error) {
	cs := env.Clientset
	for _, ns := range []string{nsIdle, nsReplay} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return "", "", err
		}
	}
	if _, err := cs.CoreV1().ConfigMaps(nsGet).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "target"}, Data: payload(0)}, metav1.CreateOptions{}); err != nil {
		return "", "", err
	}
	var g errgroup.Group
	g.SetLimit(8)
	for i := range objects {
		g.Go(func() error {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("replay-%05d", i)}, Data: payload(i)}
			_, err := cs.CoreV1().ConfigMaps(nsReplay).Create(ctx, cm, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return "", "", err
	}
	// The kube-root-ca.crt publisher does not run in the test bed (no
	// controller manager), so nothing else writes config maps from here on.
	li, err := cs.CoreV1().ConfigMaps(nsIdle).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", "", err
	}
	lg, err := cs.CoreV1().ConfigMaps(nsGet).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", "", err
	}
	return li.ResourceVersion, lg.ResourceVersion, nil
}

// payload is a config map's data: eight keys of 48 bytes, about 600 bytes
// of JSON per object, like a small real config map.
func payload(i int) map[string]string {
	d := make(map[string]string, 8)
	for k := range 8 {
		d["key-"+strconv.Itoa(k)] = fmt.Sprintf("%08d-%039d", i, k)
	}
	return d
}

// startTargets starts the bare proxy and watchgate, each in its own
// process, and returns direct, bare and watchgate, in that order, and a
// function that stops both processes.
func startTargets(ctx context.Context, env *apiserver.Env, watchgateBin, token, tmp string) ([]*target, func(), error) {
	var procs []*process
	stop := func() {
		for _, p := range procs {
			p.stop()
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(env.Config.CAData) {
		return nil, stop, fmt.Errorf("the API server's CA is not PEM")
	}
	caFile := filepath.Join(tmp, "apiserver-ca.crt")
	if err := os.WriteFile(caFile, env.Config.CAData, 0o600); err != nil {
		return nil, stop, err
	}
	addrs := make([]string, 6)
	for i := range addrs {
		a, err := apiserver.FreeAddr()
		if err != nil {
			return nil, stop, err
		}
		addrs[i] = a
	}
	self, err := os.Executable()
	if err != nil {
		return nil, stop, err
	}
	step("Starting the bare proxy (httputil.ReverseProxy) and watchgate, each in its own process")
	bp, err := startProcess("bare proxy", self, filepath.Join(tmp, "bare-proxy.log"),
		bareProxyCommand, "--listen", addrs[0], "--upstream", strings.TrimRight(env.Config.Host, "/"), "--ca-file", caFile, "--pprof", addrs[5])
	if err != nil {
		return nil, stop, err
	}
	procs = append(procs, bp)

	budgetFile := filepath.Join(tmp, "budget.yaml")
	if err := os.WriteFile(budgetFile, []byte(budget), 0o600); err != nil {
		return nil, stop, err
	}
	if out, err := env.Kubectl(ctx, "apply", "-f", budgetFile); err != nil {
		return nil, stop, fmt.Errorf("apply the bench budget: %w: %s", err, out)
	}
	logs := filepath.Join(os.TempDir(), "watchgate-bench.log")
	// One caller holds every idle watch and opens them at once: its ceiling
	// is lifted above them (--max-watches is derived from the memory
	// limit, on a machine without one the 512 MiB fallback), not a quarter
	// of the cap, and its watch opens are not held to a rate.
	wp, err := startProcess("watchgate", watchgateBin, logs,
		"--kubeconfig", env.Kubeconfig, "--proxy-bind-address", addrs[1], "--metrics-bind-address", addrs[2], "--metrics-secure=false",
		"--health-probe-bind-address", addrs[3], "--pprof-bind-address", addrs[4], "--pod-name", "watchgate-bench-0", "--shutdown-grace-period", "1s",
		"--max-watches-per-identity", "4000", "--watch-opens-per-identity-per-second", "0")
	if err != nil {
		return nil, stop, err
	}
	procs = append(procs, wp)
	fmt.Println("    watchgate logs:", logs)

	plain := &http.Client{Timeout: 5 * time.Second, Transport: newTransport("", nil)}
	if err := bp.waitReady(ctx, plain, "https://"+addrs[0]+"/version", false, 30*time.Second); err != nil {
		return nil, stop, err
	}
	if err := wp.waitReady(ctx, plain, "http://"+addrs[3]+"/readyz", true, 60*time.Second); err != nil {
		return nil, stop, err
	}
	targets := []*target{
		{name: "direct", host: strings.TrimRight(env.Config.Host, "/"), rt: newTransport(token, pool)},
		{name: "bare proxy", host: "https://" + addrs[0], rt: newTransport(token, nil), proc: bp, pprof: addrs[5]},
		{name: "watchgate", host: "https://" + addrs[1], rt: newTransport(token, nil), proc: wp, pprof: addrs[4], metrics: addrs[2], decisionHeader: "budget=bench"},
	}
	return targets, stop, nil
}

// profile fetches a CPU profile of d from the pprof server at addr into
// file.
func profile(ctx context.Context, addr string, d time.Duration, file string) error {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	return fetchProfile(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())), file)
}

// heldWatches reads, from watchgate's /metrics at addr, how many watches
// waited for another watch's verdict and how many went upstream.
func heldWatches(ctx context.Context, addr string) (held, opens float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	return apiserver.Sum(fams, "watchgate_proxy_watches_coalesced_total", nil),
		apiserver.Sum(fams, "watchgate_proxy_upstream_watch_opens_total", nil), nil
}

// fetchProfile saves what the pprof URL u answers into file.
func fetchProfile(ctx context.Context, u, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", u, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile %s: %w", u, err)
	}
	return f.Close()
}
