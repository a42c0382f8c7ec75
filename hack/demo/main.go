// Command demo is `make demo`: it starts a real kube-apiserver and etcd (the
// test bed), puts bin/watchgate in front of them, and shows the seed
// incident's storm — clients that re-subscribe forever with a resourceVersion
// the API server already called too old — first hitting the API server
// directly, then stopped by watchgate. While each storm runs, a well-behaved
// client (an informer plus periodic GETs) measures what it sees, and the
// upstream WATCH rate is sampled for a chart. A quiet baseline of the same
// length (the well-behaved client alone) comes first, so that each storm's
// own API server CPU is shown above it, beside watchgate's own CPU. Every figure it prints is
// counted, by the clients and by the API server's own /metrics; nothing is
// hard-coded. It stops by itself after about a minute and a half and cleans
// up. It is a module of its own (hack/demo) so that its plotting library
// stays out of the product's go.mod.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/rest"

	watchgatev1 "github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/test/apiserver"
)

const budget = `apiVersion: watchgate.io/v1alpha1
kind: WatchBudget
metadata:
  name: dashboard
spec:
  precedence: 100
  subjects:
  - kind: ServiceAccount
    namespace: demo
    name: dashboard
  enforcement: Enforce
  limits:
    watchOpensPerMinute: 60
    watchBurst: 10
    maxConcurrentWatches: 20
  backoff:
    initialDelaySeconds: 1
    maxDelaySeconds: 30
    shortWatchSeconds: 5
    resetAfterSeconds: 120
  staleVersions:
    action: Reject
    memorySeconds: 300
`

// maxClients bounds --clients: 1,000 storming clients are the scale the
// demo is measured at; twice that still fits the test bed's file limits.
const maxClients = 2000

// cpuShareTarget is the most of the direct storm's own API server CPU that
// watchgate's own CPU may take during its storm: 1/20.
const cpuShareTarget = 1.0 / 20

// configmaps is the collection the storm watches.
const configmaps = "/api/v1/namespaces/demo/configmaps"

func main() {
	clients := flag.Int("clients", 20, "storming clients (browser tabs), 1-"+fmt.Sprint(maxClients))
	duration := flag.Duration("storm", 10*time.Second, "how long each storm lasts, 1s-1m")
	binary := flag.String("watchgate", filepath.Join(apiserver.RepoRoot(), "bin", "watchgate"), "the watchgate binary")
	chart := flag.String("chart", filepath.Join(apiserver.RepoRoot(), "bin", "demo-watch-rate.png"), "where the chart goes (.png or .svg)")
	cpuProfile := flag.String("cpuprofile", "", "save a CPU profile of watchgate over its storm to this file")
	flag.Parse()
	if *clients < 1 || *clients > maxClients || *duration < time.Second || *duration > time.Minute {
		fmt.Fprintf(os.Stderr, "demo: --clients must be 1-%d and --storm 1s-1m\n", maxClients)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, stop := context.WithTimeout(ctx, 10*time.Minute) // bounded whatever happens
	defer stop()
	d := &demo{binary: *binary, chart: *chart, clients: *clients, storm: *duration, cpuProfile: *cpuProfile}
	if err := d.run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

// demo holds what the steps share.
type demo struct {
	binary, chart string
	cpuProfile    string
	clients       int
	storm         time.Duration

	env       *apiserver.Env
	dashboard apiserver.ServiceAccount // the storming agent's identity
	good      apiserver.ServiceAccount // the well-behaved client's identity
	staleRV   string
	wg        *watchgate
}

// run is the demo, step by step; each step is a method below.
func (d *demo) run(ctx context.Context) error {
	if err := d.startControlPlane(); err != nil {
		return err
	}
	defer func() {
		if err := d.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop the control plane:", err)
		}
	}()
	if err := d.createIdentities(ctx); err != nil {
		return err
	}
	if err := d.makeVersionStale(ctx); err != nil {
		return err
	}
	quiet, err := d.quietBaseline(ctx)
	if err != nil {
		return err
	}
	direct, err := d.stormDirect(ctx)
	if err != nil {
		return err
	}
	if err := d.startWatchgate(ctx); err != nil {
		return err
	}
	defer d.wg.stop()
	quietThrough, err := d.quietBaselineThrough(ctx)
	if err != nil {
		return err
	}
	through, err := d.stormThrough(ctx)
	if err != nil {
		return err
	}
	d.sideBySide(quiet, quietThrough, direct, through)
	if err := d.drawChart(direct, through); err != nil {
		return err
	}
	if err := d.showStatus(ctx); err != nil {
		return err
	}
	d.showMetrics(ctx)
	step("Done; stopping watchgate and the control plane")
	return nil
}

func (d *demo) startControlPlane() error {
	step("Starting a local control plane: kube-apiserver %s and etcd (no watch cache, etcd compacted every 5s)", apiserver.KubeVersion)
	env, err := apiserver.Start(apiserver.Options{
		StaleVersions:     true,
		CRDDirectoryPaths: []string{filepath.Join(apiserver.RepoRoot(), "config", "crd", "bases")},
	})
	if err != nil {
		return err
	}
	d.env = env
	fmt.Println("    API server:", env.Config.Host)
	return nil
}

func (d *demo) createIdentities(ctx context.Context) error {
	read := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}
	var err error
	if d.dashboard, err = d.env.ServiceAccount(ctx, "demo", "dashboard"); err != nil {
		return err
	}
	if d.good, err = d.env.ServiceAccount(ctx, "demo", "well-behaved"); err != nil {
		return err
	}
	for _, sa := range []apiserver.ServiceAccount{d.dashboard, d.good} {
		if err := d.env.Grant(ctx, sa, read); err != nil {
			return err
		}
	}
	fmt.Println("    a dashboard's identity:", d.dashboard.Username())
	fmt.Println("    a well-behaved client's identity (an informer plus a GET every 50 ms):", d.good.Username())
	return nil
}

func (d *demo) makeVersionStale(ctx context.Context) error {
	step("Making a resourceVersion stale, as in the seed incident: create a ConfigMap, churn 100 more, wait for etcd to compact")
	rv, err := d.env.StaleVersion(ctx, "demo", 100, 90*time.Second)
	if err != nil {
		return err
	}
	d.staleRV = rv
	fmt.Printf("    the first ConfigMap's resourceVersion %s is now \"too old\"\n", rv)
	return nil
}

// quietBaseline measures what the API server spends without a storm, over
// the storms' length: the well-behaved client and the server's own loops.
// Each storm's own cost is what it spends above this.
func (d *demo) quietBaseline(ctx context.Context) (stormResult, error) {
	step("A quiet baseline: %s of the well-behaved client alone, straight at the API server, so that each storm's own cost can be told apart", d.storm)
	r, err := runStorm(ctx, d.env, nil, d.env.ConfigFor(d.good.Token, "", nil), configmaps, d.staleRV, 0, d.storm, 0)
	if err == nil {
		r.print()
	}
	return r, err
}

// quietBaselineThrough is quietBaseline through watchgate: what watchgate
// spends serving the well-behaved client alone, so that its storm's own
// cost is told apart as the API server's is.
func (d *demo) quietBaselineThrough(ctx context.Context) (stormResult, error) {
	step("A quiet baseline through watchgate: %s of the well-behaved client alone", d.storm)
	r, err := runStorm(ctx, d.env, nil, d.proxied(d.good.Token), configmaps, d.staleRV, 0, d.storm, d.wg.cmd.Process.Pid)
	if err == nil {
		r.print()
	}
	return r, err
}

func (d *demo) stormDirect(ctx context.Context) (stormResult, error) {
	step("Storm 1, straight at the API server: %d clients re-subscribe from resourceVersion %s for %s, at once after every answer", d.clients, d.staleRV, d.storm)
	r, err := runStorm(ctx, d.env, d.env.ConfigFor(d.dashboard.Token, "", nil), d.env.ConfigFor(d.good.Token, "", nil), configmaps, d.staleRV, d.clients, d.storm, 0)
	if err == nil {
		r.print()
	}
	return r, err
}

func (d *demo) startWatchgate(ctx context.Context) error {
	step("Starting watchgate in front of the API server, with a WatchBudget for the dashboard")
	file := filepath.Join(os.TempDir(), "watchgate-demo-budget.yaml")
	if err := os.WriteFile(file, []byte(budget), 0o600); err != nil {
		return err
	}
	out, err := d.env.Kubectl(ctx, "apply", "-f", file)
	fmt.Print(indent(out))
	if err != nil {
		return err
	}
	d.wg, err = startWatchgate(ctx, d.binary, d.env.Kubeconfig)
	if err != nil {
		return err
	}
	fmt.Println("    proxy:", d.wg.proxyURL, " metrics:", d.wg.metricsURL)
	return nil
}

// proxied is a client config for the proxy; the demo's proxy serves a
// self-signed certificate.
func (d *demo) proxied(token string) *rest.Config {
	cfg := d.env.ConfigFor(token, d.wg.proxyURL, nil)
	cfg.TLSClientConfig = rest.TLSClientConfig{Insecure: true}
	return cfg
}

func (d *demo) stormThrough(ctx context.Context) (stormResult, error) {
	step("Storm 2, the same clients through watchgate (only the server URL changed); the well-behaved client too")
	profiled := make(chan error, 1)
	if d.cpuProfile != "" {
		go func() { profiled <- d.wg.profileCPU(ctx, d.storm, d.cpuProfile) }()
	} else {
		profiled <- nil
	}
	r, err := runStorm(ctx, d.env, d.proxied(d.dashboard.Token), d.proxied(d.good.Token), configmaps, d.staleRV, d.clients, d.storm, d.wg.cmd.Process.Pid)
	if perr := <-profiled; perr != nil {
		fmt.Fprintln(os.Stderr, "demo: watchgate's CPU profile:", perr)
	} else if d.cpuProfile != "" {
		fmt.Println("    watchgate's CPU profile over its storm:", d.cpuProfile)
	}
	if err == nil {
		r.print()
	}
	return r, err
}

func (d *demo) sideBySide(quiet, quietThrough, direct, through stormResult) {
	step("Side by side")
	s := d.storm.Seconds()
	row := func(name, direct, through string) { fmt.Printf("    %-46s %12s %12s\n", name, direct, through) }
	row("", "direct", "watchgate")
	row("resubscriptions by clients", fmt.Sprint(direct.attempts), fmt.Sprint(through.attempts))
	row("WATCHes reaching the API server", fmt.Sprintf("%.0f", direct.upstream), fmt.Sprintf("%.0f", through.upstream))
	row("upstream WATCH/s", fmt.Sprintf("%.1f", direct.upstream/s), fmt.Sprintf("%.1f", through.upstream/s))
	// One stale version is stormed, on one resource, by one replica.
	fmt.Printf("    %-46s %12.0f %12.0f   (target: 1)\n", "upstream WATCHes per stale version", direct.upstream, through.upstream)
	row(fmt.Sprintf("API server CPU s, quiet baseline %.0fs", s), fmt.Sprintf("%.1f", quiet.apiCPU), fmt.Sprintf("%.1f", quiet.apiCPU))
	row("API server CPU s, the storm's own (above it)", fmt.Sprintf("%.1f", aboveBaseline(direct.apiCPU, quiet.apiCPU)), fmt.Sprintf("%.1f", aboveBaseline(through.apiCPU, quiet.apiCPU)))
	row("watchgate's own CPU s during the storm", "—", fmt.Sprintf("%.2f", through.proxyCPU))
	row("watchgate's CPU s, quiet baseline", "—", fmt.Sprintf("%.2f", quietThrough.proxyCPU))
	proxyOwn := aboveBaseline(through.proxyCPU, quietThrough.proxyCPU)
	row("watchgate's CPU s, the storm's own (above it)", "—", fmt.Sprintf("%.2f", proxyOwn))
	if own := aboveBaseline(direct.apiCPU, quiet.apiCPU); own > 0 {
		row("watchgate's CPU ÷ the direct storm's own, all", "—", share(through.proxyCPU, own))
		fmt.Printf("    %-46s %12s %12s   (target: at most 1/%.0f)\n", "watchgate's storm's own ÷ the direct one's", "—",
			share(proxyOwn, own), 1/cpuShareTarget)
	}
	row("well-behaved client GET p50", ms(direct.wellBehaved.p50), ms(through.wellBehaved.p50))
	row("well-behaved client GET p99", ms(direct.wellBehaved.p99), ms(through.wellBehaved.p99))
	row("well-behaved informer sync", ms(direct.wellBehaved.synced), ms(through.wellBehaved.synced))
	if through.upstream < direct.upstream {
		fmt.Printf("    watchgate kept %.1f%% of the storm away from the API server\n", 100*(1-through.upstream/max(direct.upstream, 1)))
	}
}

func (d *demo) drawChart(direct, through stormResult) error {
	if err := os.MkdirAll(filepath.Dir(d.chart), 0o755); err != nil {
		return err
	}
	if err := writeChart(d.chart, d.clients, direct, through); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	fmt.Println("\n    chart of upstream WATCH/s over time, direct vs through watchgate:", d.chart)
	return nil
}

// showStatus waits until this replica's entry in the budget's status shows
// the storm (a rejection counted), then prints kubectl get wb.
func (d *demo) showStatus(ctx context.Context) error {
	step("What the operator sees: kubectl get wb (once %s has written the storm into the budget's status)", podName)
	deadline := time.Now().Add(60 * time.Second)
	for {
		shown, err := d.statusShowsStorm(ctx)
		if err != nil {
			return err
		}
		if shown {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the budget's status shows no rejection by %s after 60s", podName)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	out, err := d.env.Kubectl(ctx, "get", "wb", "-o", "wide")
	fmt.Print(indent(out))
	return err
}

func (d *demo) statusShowsStorm(ctx context.Context) (bool, error) {
	out, err := d.env.Kubectl(ctx, "get", "wb", "dashboard", "-o", "json")
	if err != nil {
		return false, err
	}
	var wb watchgatev1.WatchBudget
	if err := json.Unmarshal([]byte(out), &wb); err != nil {
		return false, fmt.Errorf("kubectl get wb dashboard: %w", err)
	}
	for _, r := range wb.Status.Replicas {
		if r.Pod == podName && r.RecentRejections > 0 {
			return true, nil
		}
	}
	return false, nil
}

func (d *demo) showMetrics(ctx context.Context) {
	step("And watchgate's own metrics (no user names in labels)")
	fmt.Print(indent(grepMetrics(ctx, d.wg.metricsURL, "watchgate_proxy_requests_total", "watchgate_proxy_stale_versions_learned_total", "watchgate_proxy_upstream_watch_opens_total")))
}

func grepMetrics(ctx context.Context, url string, prefixes ...string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return err.Error() + "\n"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				out.WriteString(line + "\n")
			}
		}
	}
	return out.String()
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}
