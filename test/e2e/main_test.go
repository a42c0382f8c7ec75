package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	dto "github.com/prometheus/client_model/go"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

var env *apiserver.Env

func TestMain(m *testing.M) {
	apiserver.Main(m, &env, apiserver.Suite{Options: apiserver.Options{StaleVersions: true}})
}

// testProxy is a proxy.Server serving in front of the test bed.
type testProxy struct {
	*proxy.Server
	Engine *ratelimit.Engine
	URL    string
	CA     []byte
	stop   func()
}

// generous governs everyone with limits no test reaches, and rejects stale
// versions locally.
func generous(name string, precedence int32) ratelimit.Budget {
	return ratelimit.Budget{
		Name:        name,
		Precedence:  precedence,
		Enforcement: ratelimit.Enforce,
		Limits: ratelimit.Limits{
			WatchOpensPerMinute: 60000, WatchBurst: 10000, MaxConcurrentWatches: 10000,
		},
		StaleVersions: ratelimit.StaleVersions{Action: ratelimit.StaleReject, Memory: 10 * time.Minute},
	}
}

// startProxy starts a proxy with a fresh engine holding budgets, waits until
// it is ready and stops it when the test ends.
func startProxy(t testing.TB, budgets ...ratelimit.Budget) *testProxy {
	t.Helper()
	return startProxyWith(t, nil, budgets...)
}

// startProxyWith is startProxy with options changed by mutate.
func startProxyWith(t testing.TB, mutate func(*proxy.Options), budgets ...ratelimit.Budget) *testProxy {
	t.Helper()
	engine := ratelimit.NewEngine(ratelimit.Options{Seed: 1})
	policy, err := ratelimit.NewPolicy(budgets)
	if err != nil {
		t.Fatal(err)
	}
	engine.SetPolicy(time.Now(), policy)
	srv, url, ca, stop := startProxyOn(t, env, engine, func(o *proxy.Options) {
		o.ShutdownGracePeriod = 1500 * time.Millisecond
		o.UpstreamProbeInterval = 0 // the default
		if mutate != nil {
			mutate(o)
		}
	})
	return &testProxy{Server: srv, Engine: engine, URL: url, CA: ca, stop: stop}
}

// agentOn makes, on the control plane e, a service account in a new
// namespace (prefix) that may read and watch configmaps, and starts a proxy
// in front of e whose one budget ("everyone") is generous; it returns the
// account, the proxy's engine and what startProxyOn returns.
func agentOn(t testing.TB, e *apiserver.Env, prefix string) (apiserver.ServiceAccount, *ratelimit.Engine, *proxy.Server, string, []byte, func()) {
	t.Helper()
	ctx := context.Background()
	sa, err := e.ServiceAccount(ctx, uniqueName(prefix), "agent")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Grant(ctx, sa, readWatch("configmaps")); err != nil {
		t.Fatal(err)
	}
	engine := ratelimit.NewEngine(ratelimit.Options{Seed: 1})
	policy, err := ratelimit.NewPolicy([]ratelimit.Budget{generous("everyone", 100)})
	if err != nil {
		t.Fatal(err)
	}
	engine.SetPolicy(time.Now(), policy)
	srv, url, ca, stop := startProxyOn(t, e, engine, nil)
	return sa, engine, srv, url, ca, stop
}

// startProxyOn starts a proxy with engine in front of the control plane e,
// with a fast upstream probe, options changed by tune; it waits until the
// proxy is ready and stops it when the test ends (or when the returned
// function is called).
func startProxyOn(t testing.TB, e *apiserver.Env, engine proxy.Engine, tune func(*proxy.Options)) (*proxy.Server, string, []byte, func()) {
	t.Helper()
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("localhost", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	opts := proxy.Options{
		BindAddress: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile,
		Upstream: e.Config, Engine: engine, Logger: testLogger(),
		ShutdownDrainDelay: time.Millisecond, ShutdownGracePeriod: 500 * time.Millisecond,
		UpstreamProbeInterval: 200 * time.Millisecond,
	}
	if tune != nil {
		tune(&opts)
	}
	srv, err := proxy.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("proxy stopped with: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("proxy did not stop within 30s")
		}
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(30 * time.Second)
	for srv.ReadyCheck(nil) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("proxy not ready: %v", srv.ReadyCheck(nil))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return srv, "https://" + srv.Addr().String(), certPEM, stop
}

// Config returns a client config that reaches the API server through the
// proxy with token, in JSON or (protobuf true) protobuf.
func (p *testProxy) Config(token string, protobuf bool) *rest.Config {
	cfg := env.ConfigFor(token, p.URL, p.CA)
	if protobuf {
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	}
	return cfg
}

// rawGet sends GET path with the token and extra headers to the proxy
// (p non-nil) or directly to the API server, and returns the response
// with its body read (at most 1 MiB) and closed.
func rawGet(t *testing.T, p *testProxy, token, path string, headers map[string]string) (*http.Response, []byte) {
	t.Helper()
	var cfg *rest.Config
	if p != nil {
		cfg = p.Config(token, false)
	} else {
		cfg = env.ConfigFor(token, "", nil)
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp, body
}

// proxyMetric sums the proxy's metric family over the series whose labels
// include match.
func proxyMetric(t testing.TB, family string, match map[string]string) float64 {
	t.Helper()
	fams, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	return apiserver.Sum(byName, family, match)
}

// eventually polls cond every 100ms until it is true or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// serviceAccount creates a service account whose rules allow rules.
func serviceAccount(t testing.TB, namespace, name string, rules ...rbacv1.PolicyRule) apiserver.ServiceAccount {
	t.Helper()
	ctx := context.Background()
	sa, err := env.ServiceAccount(ctx, namespace, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) > 0 {
		if err := env.Grant(ctx, sa, rules...); err != nil {
			t.Fatal(err)
		}
	}
	return sa
}

func readWatch(resources ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{""}, Resources: resources, Verbs: []string{"get", "list", "watch"}}
}

// impersonateUsers lets a service account impersonate any user.
var impersonateUsers = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}}

// everyoneReadsConfigMaps lets every authenticated user get, list and
// watch configmaps in ns, so that the watches of users an agent makes up
// are served (and stay open) as they would be for real users.
func everyoneReadsConfigMaps(t testing.TB, ns string) {
	t.Helper()
	reader := serviceAccount(t, ns, "reader", readWatch("configmaps"))
	if _, err := env.Clientset.RbacV1().RoleBindings(ns).Create(context.Background(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "everyone-reads"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "watchgate-test:" + ns + ":" + reader.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := env.WaitAllowed(context.Background(), ns, "anyone", []string{"system:authenticated"}, readWatch("configmaps")); err != nil {
		t.Fatal(err)
	}
}

func testLogger() logr.Logger {
	if os.Getenv("WATCHGATE_TEST_LOG") == "" {
		return logr.Discard()
	}
	return funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: 2})
}

// uniqueName returns prefix with a random suffix, so that tests can run
// repeatedly against one API server.
func uniqueName(prefix string) string {
	return prefix + "-" + utilrand.String(5)
}
