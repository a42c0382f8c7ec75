package main

import (
	"context"
	"crypto/tls"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/test/apiserver"
)

var env *apiserver.Env

func TestMain(m *testing.M) {
	apiserver.Main(m, &env, apiserver.Suite{Options: apiserver.Options{
		CRDDirectoryPaths: []string{filepath.Join(apiserver.RepoRoot(), "config", "crd", "bases")},
	}})
}

func TestRunFailsWithOneLineErrors(t *testing.T) {
	unreachable := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(unreachable, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: x}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args []string
		want []string
	}{
		"a kubeconfig that does not exist": {
			args: []string{"--kubeconfig", "/does/not/exist"},
			want: []string{"load --kubeconfig /does/not/exist"},
		},
		"an API server nobody answers at": {
			args: []string{"--kubeconfig", unreachable, "--upstream-check-timeout", "2s"},
			want: []string{"API server https://127.0.0.1:1 unreachable"},
		},
		"every bad flag at once": {
			args: []string{"--tls-cert-file", "c.pem", "--proxy-bind-address", "8443", "--shutdown-grace-period", "1h"},
			want: []string{"--tls-private-key-file: Required value", `--proxy-bind-address: Invalid value: "8443"`, `--shutdown-grace-period: Invalid value: "1h0m0s": must be at most 10m0s`},
		},
		"injection without a serving certificate": {
			args: []string{"--webhook-port", "9443", "--inject-service-port", "0"},
			want: []string{"--tls-cert-file: Required value: --webhook-port needs it", "--inject-service-port: Invalid value: 0"},
		},
		"a negative watch-open ceiling": {
			args: []string{"--watch-opens-per-identity-per-second", "-1", "--watch-open-burst-per-identity", "-2"},
			want: []string{"--watch-opens-per-identity-per-second: Invalid value: -1", "--watch-open-burst-per-identity: Invalid value: -2"},
		},
		"a watch-open rate that is not a number": {
			args: []string{"--watch-opens-per-identity-per-second", "NaN"},
			want: []string{"--watch-opens-per-identity-per-second: Invalid value: NaN: must be a number, 0 or more"},
		},
		"a memory mark over 100%": {
			args: []string{"--memory-high-water-percent", "101"},
			want: []string{"--memory-high-water-percent: Invalid value: 101: must be at most 100"},
		},
		"a webhook certificate without its key": {
			args: []string{"--webhook-cert-file", "w.pem"},
			want: []string{"--webhook-key-file: Required value: with --webhook-cert-file"},
		},
		"a negative replica count": {
			args: []string{"--replicas", "-1"},
			want: []string{"--replicas: Invalid value: -1: must be 0 or more"},
		},
		"profiles on every interface": {
			args: []string{"--pprof-bind-address", ":6060"},
			want: []string{`--pprof-bind-address: Invalid value: ":6060": must be a loopback address`},
		},
		"a bootstrap budget that would exempt everyone": {
			args: []string{"--bootstrap-budgets", `[{"name":"wg-exempt","mandatory":true,"spec":{"enforcement":"Exempt"}}]`},
			want: []string{"--bootstrap-budgets: Invalid value: budget wg-exempt: an Exempt budget needs subjects"},
		},
		"a mode that does not exist": {
			args: []string{"--mode", "webhook"},
			want: []string{`--mode: Unsupported value: "webhook": supported values: "all", "proxy", "injector"`},
		},
		"the injector without a webhook port": {
			args: []string{"--mode", "injector"},
			want: []string{"--webhook-port: Required value: --mode=injector needs it"},
		},
		"injection in proxy mode": {
			args: []string{"--mode", "proxy", "--webhook-port", "9443", "--tls-cert-file", "c", "--tls-private-key-file", "k"},
			want: []string{"--webhook-port: Forbidden: needs --mode=all or --mode=injector"},
		},
		"an unknown flag": {
			args: []string{"--proxy-bind", ":1"},
			want: []string{"flag provided but not defined: -proxy-bind"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := run(ctx, tc.args)
			if err == nil {
				t.Fatal("run succeeded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans several lines: %q", err)
			}
		})
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := apiserver.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func get(t *testing.T, c *http.Client, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRunServesProbesMetricsAndTheProxy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sa, err := env.ServiceAccount(ctx, "main-test", "reader")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Grant(ctx, sa, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}}); err != nil {
		t.Fatal(err)
	}

	proxyAddr, metricsAddr, probeAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{
			"--kubeconfig", env.Kubeconfig,
			"--proxy-bind-address", proxyAddr,
			"--metrics-bind-address", metricsAddr,
			"--health-probe-bind-address", probeAddr,
			"--pod-name", "main-test-0",
			"--shutdown-grace-period", "1s",
		})
	}()
	plain := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := get(t, plain, "http://"+probeAddr+"/readyz", "")
		if code == http.StatusOK {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not ready within 60s: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code, body := get(t, plain, "http://"+probeAddr+"/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz = %d %s, want 200", code, body)
	}

	// The proxy forwards the caller's own token: the service account may
	// list ConfigMaps in its namespace and nothing else.
	insecure := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	base := "https://" + proxyAddr
	if code, body := get(t, insecure, base+"/api/v1/namespaces/main-test/configmaps", sa.Token); code != http.StatusOK || !strings.Contains(body, `"kind":"ConfigMapList"`) {
		t.Errorf("list through the proxy = %d %.200s, want 200 and a ConfigMapList", code, body)
	}
	if code, _ := get(t, insecure, base+"/api/v1/secrets", sa.Token); code != http.StatusForbidden {
		t.Errorf("listing secrets through the proxy = %d, want 403 (the proxy must not lend its own rights)", code)
	}
	if code, _ := get(t, insecure, base+"/api/v1/namespaces/main-test/configmaps", ""); code != http.StatusUnauthorized {
		t.Errorf("no token through the proxy = %d, want 401", code)
	}

	// /metrics is HTTPS and answers only callers the API server says may
	// get /metrics.
	scraper, err := env.ServiceAccount(ctx, "main-test", "scraper")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Grant(ctx, scraper, rbacv1.PolicyRule{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}); err != nil {
		t.Fatal(err)
	}
	// The metrics server starts beside the probes, not before readiness.
	servingBy := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", metricsAddr, 5*time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(servingBy) {
			t.Fatalf("/metrics not listening on %s within 30s: %v", metricsAddr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, _ := get(t, plain, "http://"+metricsAddr+"/metrics", ""); code == http.StatusOK {
		t.Errorf("/metrics over plain HTTP = 200, want it served over HTTPS only")
	}
	for _, c := range []struct {
		who, token string
		want       int
	}{{"no token", "", http.StatusUnauthorized}, {"a token not allowed /metrics", sa.Token, http.StatusForbidden}} {
		if code, body := get(t, insecure, "https://"+metricsAddr+"/metrics", c.token); code != c.want {
			t.Errorf("/metrics with %s = %d %.200s, want %d", c.who, code, body, c.want)
		}
	}
	code, metrics := get(t, insecure, "https://"+metricsAddr+"/metrics", scraper.Token)
	if code != http.StatusOK || !strings.Contains(metrics, "watchgate_") {
		t.Errorf("/metrics as a scraper = %d, want 200 with watchgate_ metrics; got %.300s", code, metrics)
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after cancel = %v, want a clean shutdown", err)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("run did not return within 45s of cancel")
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:6060": true, "[::1]:6060": true, "localhost:6060": true, "127.1.2.3:6060": true,
		":6060": false, "0.0.0.0:6060": false, "[::]:6060": false, "10.0.0.1:6060": false, "example.com:6060": false, "6060": false,
	} {
		if got := isLoopback(addr); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// Every bad flag is reported, main's own first, then the proxy's in the
// order of its options, and the same flags give the same message every
// time (the address checks once ran over a map).
func TestFlagErrorsComeInAFixedOrder(t *testing.T) {
	o := options{
		probeBindAddress:   "8081",
		metricsBindAddress: "8080",
		pprofBindAddress:   "6060",
		upstreamTimeout:    time.Hour,
		injectServicePort:  443,
		proxy: proxy.Options{
			BindAddress:         "8443",
			CertFile:            "c.pem",
			ShutdownGracePeriod: time.Hour,
		},
	}
	first := o.validate()
	if first == nil {
		t.Fatal("validate accepted bad flags")
	}
	want := []string{"--health-probe-bind-address", "--metrics-bind-address", "--pprof-bind-address", "--upstream-check-timeout", "--proxy-bind-address", "--tls-private-key-file", "--shutdown-grace-period"}
	at := -1
	for _, flag := range want {
		i := strings.Index(first.Error(), flag+":")
		if i <= at {
			t.Fatalf("%s is missing or out of order in %q", flag, first)
		}
		at = i
	}
	for range 20 {
		if err := o.validate(); err.Error() != first.Error() {
			t.Fatalf("validate's message changed between runs:\n%q\n%q", first, err)
		}
	}
}

// A flag given 0 means what its help says, and proxy.Options agrees: the
// flags whose help says "0: the default" are accepted at 0 and passed on as
// 0, which the proxy reads as its default.
func TestZeroFlagsAreAcceptedWhereTheirHelpSaysSo(t *testing.T) {
	var o options
	fs := flag.NewFlagSet("watchgate", flag.ContinueOnError)
	o.addFlags(fs)
	var zeros []string
	fs.VisitAll(func(f *flag.Flag) {
		if strings.Contains(f.Usage, "0: the default") || strings.Contains(f.Usage, "0: no ") || strings.Contains(f.Usage, "0 (default)") {
			zeros = append(zeros, "--"+f.Name+"=0")
		}
	})
	for _, want := range []string{"--memory-high-water-percent=0", "--shutdown-grace-period=0", "--max-watches=0", "--review-timeout=0"} {
		if !slices.Contains(zeros, want) {
			t.Errorf("the help of %s does not say what 0 means", want)
		}
	}
	if err := fs.Parse(zeros); err != nil {
		t.Fatal(err)
	}
	if err := o.validate(); err != nil {
		t.Errorf("%v: %v", zeros, err)
	}
}

// Every row of proxyFlags names a flag, and every flag that sets a field
// of proxy.Options has a row, so that Validate's errors name flags.
func TestEveryProxyFlagIsNamed(t *testing.T) {
	var o options
	fs := flag.NewFlagSet("watchgate", flag.ContinueOnError)
	o.addFlags(fs)
	named := map[string]bool{}
	for path, name := range proxyFlags {
		if fs.Lookup(name) == nil {
			t.Errorf("proxyFlags[%q] = %q: no such flag", path, name)
		}
		named[name] = true
	}
	// A flag set by fs.XVar(&o.proxy.Field, …) points into o.proxy.
	start := reflect.ValueOf(&o.proxy).Pointer()
	end := start + reflect.TypeOf(o.proxy).Size()
	fs.VisitAll(func(f *flag.Flag) {
		v := reflect.ValueOf(f.Value)
		if v.Kind() != reflect.Pointer {
			return
		}
		if p := v.Pointer(); p >= start && p < end && !named[f.Name] {
			t.Errorf("--%s sets a field of proxy.Options but has no row in proxyFlags", f.Name)
		}
	})
}
