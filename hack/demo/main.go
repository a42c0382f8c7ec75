// Command demo is `make demo`: it starts a real kube-apiserver and etcd (the
// test bed), puts bin/watchgate in front of them, and shows the seed
// incident's storm — clients that re-subscribe forever with a resourceVersion
// the API server already called too old — first hitting the API server
// directly, then stopped by watchgate. Every figure it prints is counted, by
// the clients and by the API server's own /metrics; nothing is hard-coded.
// It stops by itself after about a minute and cleans up.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/rest"

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

func main() {
	clients := flag.Int("clients", 20, "storming clients (browser tabs), 1-200")
	duration := flag.Duration("storm", 10*time.Second, "how long each storm lasts, 1s-1m")
	binary := flag.String("watchgate", "bin/watchgate", "the watchgate binary")
	flag.Parse()
	if *clients < 1 || *clients > 200 || *duration < time.Second || *duration > time.Minute {
		fmt.Fprintln(os.Stderr, "demo: --clients must be 1-200 and --storm 1s-1m")
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := demo(ctx, *binary, *clients, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func demo(ctx context.Context, binary string, clients int, storm time.Duration) error {
	step("Starting a local control plane: kube-apiserver %s and etcd (no watch cache, etcd compacted every 5s)", apiserver.KubeVersion)
	env, err := apiserver.Start(apiserver.Options{
		StaleVersions:     true,
		CRDDirectoryPaths: []string{filepath.Join(apiserver.RepoRoot(), "config", "crd", "bases")},
	})
	if err != nil {
		return err
	}
	defer env.Stop()
	fmt.Println("    API server:", env.Config.Host)

	sa, err := env.ServiceAccount(ctx, "demo", "dashboard")
	if err != nil {
		return err
	}
	if err := env.Grant(ctx, sa, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}); err != nil {
		return err
	}
	fmt.Println("    a dashboard's identity:", sa.Username())

	step("Making a resourceVersion stale, as in the seed incident: create a ConfigMap, churn 100 more, wait for etcd to compact")
	staleRV, err := env.StaleVersion(ctx, "demo", 100, 90*time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("    the first ConfigMap's resourceVersion %s is now \"too old\"\n", staleRV)
	path := "/api/v1/namespaces/demo/configmaps"

	step("Storm 1, straight at the API server: %d clients re-subscribe from resourceVersion %s for %s, at once after every answer", clients, staleRV, storm)
	direct := env.ConfigFor(sa.Token, "", nil)
	d, err := runStorm(ctx, env, direct, path, staleRV, clients, storm)
	if err != nil {
		return err
	}
	d.print()

	step("Starting watchgate in front of the API server, with a WatchBudget for the dashboard")
	apply := exec.CommandContext(ctx, filepath.Join(env.AssetsDir, "kubectl"), "--kubeconfig="+env.Kubeconfig, "apply", "-f", "-")
	apply.Stdin = strings.NewReader(budget)
	apply.Stdout, apply.Stderr = os.Stdout, os.Stderr
	if err := apply.Run(); err != nil {
		return fmt.Errorf("kubectl apply: %w", err)
	}
	wg, err := startWatchgate(ctx, binary, env.Kubeconfig)
	if err != nil {
		return err
	}
	defer wg.stop()
	fmt.Println("    proxy:", wg.proxyURL, " metrics:", wg.metricsURL)

	step("Storm 2, the same clients through watchgate (only the server URL changed)")
	through := env.ConfigFor(sa.Token, wg.proxyURL, nil)
	through.TLSClientConfig = rest.TLSClientConfig{Insecure: true} // the demo's proxy serves a self-signed certificate
	p, err := runStorm(ctx, env, through, path, staleRV, clients, storm)
	if err != nil {
		return err
	}
	p.print()

	step("Side by side")
	fmt.Printf("    %-28s %12s %12s\n", "", "direct", "watchgate")
	fmt.Printf("    %-28s %12d %12d\n", "resubscriptions by clients", d.attempts, p.attempts)
	fmt.Printf("    %-28s %12.0f %12.0f\n", "WATCHes reaching API server", d.upstream, p.upstream)
	fmt.Printf("    %-28s %12.1f %12.1f\n", "upstream WATCH/s", d.upstream/storm.Seconds(), p.upstream/storm.Seconds())
	if p.upstream < d.upstream {
		fmt.Printf("    watchgate kept %.1f%% of the storm away from the API server\n", 100*(1-p.upstream/max(d.upstream, 1)))
	}

	step("What the operator sees: kubectl get wb")
	time.Sleep(16 * time.Second) // replicas write status at most every 15s
	out, err := env.Kubectl(ctx, "get", "wb", "-o", "wide")
	fmt.Print(indent(out))
	if err != nil {
		return err
	}
	step("And watchgate's own metrics (no user names in labels)")
	fmt.Print(indent(grepMetrics(ctx, wg.metricsURL, "watchgate_proxy_requests_total", "watchgate_proxy_stale_versions_learned_total", "watchgate_proxy_upstream_watch_opens_total")))
	step("Done; stopping watchgate and the control plane")
	return nil
}

type stormResult struct {
	attempts int64
	answers  map[string]int64
	upstream float64
}

func (r stormResult) print() {
	fmt.Printf("    %d resubscriptions; answers:", r.attempts)
	for k, v := range r.answers {
		fmt.Printf(" %s×%d", k, v)
	}
	fmt.Printf("\n    the API server counted %.0f WATCH requests on configmaps (apiserver_request_total)\n", r.upstream)
}

// runStorm runs clients that do what the seed's dashboard did: watch from
// rv, read until the stream ends, and re-subscribe at once with the same rv.
func runStorm(ctx context.Context, env *apiserver.Env, cfg *rest.Config, path, rv string, clients int, d time.Duration) (stormResult, error) {
	before, err := env.WatchRequests(ctx, "", "configmaps")
	if err != nil {
		return stormResult{}, err
	}
	var attempts atomic.Int64
	var mu sync.Mutex
	answers := map[string]int64{}
	stormCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for stormCtx.Err() == nil {
				a, err := apiserver.WatchFor(stormCtx, cfg, path, rv, 5*time.Second)
				if stormCtx.Err() != nil {
					return
				}
				attempts.Add(1)
				key := "error"
				switch {
				case err != nil:
				case a.HTTPStatus == http.StatusOK && a.Code == http.StatusGone:
					key = "200+410"
				default:
					key = fmt.Sprint(a.HTTPStatus)
				}
				mu.Lock()
				answers[key]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond) // let the API server count the last ones
	after, err := env.WatchRequests(ctx, "", "configmaps")
	if err != nil {
		return stormResult{}, err
	}
	return stormResult{attempts: attempts.Load(), answers: answers, upstream: after - before}, nil
}

type watchgate struct {
	cmd                  *exec.Cmd
	proxyURL, metricsURL string
	done                 chan struct{}
}

func startWatchgate(ctx context.Context, binary, kubeconfig string) (*watchgate, error) {
	var addrs [3]string
	for i := range addrs {
		a, err := apiserver.FreeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	cmd := exec.Command(binary, "--kubeconfig", kubeconfig,
		"--proxy-bind-address", addrs[0], "--metrics-bind-address", addrs[1], "--health-probe-bind-address", addrs[2],
		"--pod-name", "watchgate-demo-0", "--shutdown-grace-period", "1s")
	logs, err := os.Create(filepath.Join(os.TempDir(), "watchgate-demo.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (run `make build`): %w", binary, err)
	}
	w := &watchgate{cmd: cmd, proxyURL: "https://" + addrs[0], metricsURL: "http://" + addrs[1] + "/metrics", done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logs.Close(); close(w.done) }()
	fmt.Println("    logs:", logs.Name())
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + addrs[2] + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return w, nil
			}
		}
		select {
		case <-w.done:
			return nil, fmt.Errorf("watchgate exited before it was ready; see %s", logs.Name())
		case <-ctx.Done():
			w.stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			w.stop()
			return nil, fmt.Errorf("watchgate not ready within 60s; see %s", logs.Name())
		}
	}
}

func (w *watchgate) stop() {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.done
	}
}

func grepMetrics(ctx context.Context, url string, prefixes ...string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{}}}
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
