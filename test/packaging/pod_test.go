package packaging

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/watchgate/watchgate/test/apiserver"
)

// TestChartPodRunsWithTheChartsRBAC runs the watchgate binary the way the
// installed chart's Deployment does (its leader creating the default
// budgets from the chart's flags) — its arguments, its environment, its
// certificate from the chart's Secret — as the chart's ServiceAccount, with
// only the permissions the chart grants. The test bed has no kubelet, so the
// test plays it: a missing permission (a Lease, a status patch, a
// TokenReview) shows up as a replica that never turns ready or an error in
// its log. Then a watch goes through the proxy, trusting the chart's CA.
// Then a budget throttles that client, and the replica records the Event on
// the (cluster-scoped) budget in default, the only namespace it may write
// Events in. Last, the API server confirms the ServiceAccount may list pods
// in the release namespace only (the pruner's one-minute round is later than
// the test looks) and write Events in default (the budgets') and the release
// namespace (leader election's) only.
func TestChartPodRunsWithTheChartsRBAC(t *testing.T) {
	installPrerequisites(t)
	dir := t.TempDir()

	bin := filepath.Join(dir, "watchgate")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, ".")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	// The installed release's Deployment, as Helm applied it.
	manifest, err := helm(t, "get", "manifest", releaseName, "--namespace", releaseNamespace)
	if err != nil {
		t.Fatal(err)
	}
	dep := find(t, decode(t, manifest), "Deployment", "watchgate")
	c := container(t, dep)

	// The serving certificate from the chart's Secret, where the pod would
	// mount it.
	tlsDir := filepath.Join(dir, "tls")
	if err := os.Mkdir(tlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	caPEM := secretKey(t, "ca.crt")
	writeFile(t, filepath.Join(tlsDir, "tls.crt"), secretKey(t, "tls.crt"))
	writeFile(t, filepath.Join(tlsDir, "tls.key"), secretKey(t, "tls.key"))

	// The ServiceAccount's own credentials, as the in-cluster config would
	// give them.
	token := strings.TrimSpace(kubectlOK(t, "create", "token", "watchgate", "--namespace", releaseNamespace, "--duration=1h"))
	kubeconfig := filepath.Join(dir, "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
	cfg.AuthInfos["watchgate"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "watchgate"}
	cfg.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}

	ports := map[string]string{}
	var args []string
	for _, v := range c["args"].([]any) {
		a := v.(string)
		name, _, _ := strings.Cut(a, "=")
		switch name {
		case "--proxy-bind-address", "--metrics-bind-address", "--health-probe-bind-address":
			ports[name] = freeAddress(t)
			a = name + "=" + ports[name]
		case "--tls-cert-file", "--tls-private-key-file":
			a = name + "=" + filepath.Join(tlsDir, filepath.Base(a))
		}
		args = append(args, a)
	}
	for _, name := range []string{"--proxy-bind-address", "--health-probe-bind-address"} {
		if ports[name] == "" {
			t.Fatalf("the chart's Deployment does not pass %s: %v", name, c["args"])
		}
	}
	args = append(args, "--kubeconfig="+kubeconfig)

	log := &apiserver.LockedBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "POD_NAME=watchgate-packaging-test", "POD_NAMESPACE="+releaseNamespace)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed when the process has ended; waitErr is then its
	// exit status.
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

	// The kubelet's readiness probe, until it passes.
	apiserver.WaitWhileRunning(t, exited, &waitErr, 90*time.Second, "/readyz", func() bool {
		resp, err := http.Get("http://" + ports["--health-probe-bind-address"] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// A client trusting the chart's CA, for the Service's DNS name, opens a
	// watch through the proxy; the catch-all budget governs it.
	sa, err := env.ServiceAccount(t.Context(), "packaging-client", "reader")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(caPEM))
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "watchgate." + releaseNamespace + ".svc"},
	}}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet,
		"https://"+ports["--proxy-bind-address"]+"/api/v1/namespaces/packaging-client/configmaps?watch=true&timeoutSeconds=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+sa.Token)
	// The leader creates the chart's default budgets (--bootstrap-budgets)
	// with the chart's RBAC, and every replica then enforces them.
	apiserver.WaitWhileRunning(t, exited, &waitErr, 60*time.Second, "the bootstrapped budgets", func() bool {
		out, err := kubectl(t, "", "get", "wb", "watchgate-default", "watchgate-agents", "watchgate-exempt",
			"-o", `jsonpath={range .items[*]}{.metadata.labels.watchgate\.io/bootstrap}{" "}{end}`)
		return err == nil && strings.Count(out, releaseNamespace) == 3
	})
	var resp *http.Response
	apiserver.WaitWhileRunning(t, exited, &waitErr, 30*time.Second, "a watch governed by the agents budget", func() bool {
		resp, err = client.Do(req.Clone(t.Context()))
		if err != nil {
			t.Fatalf("watch through the proxy: %v", err)
		}
		resp.Body.Close()
		return strings.Contains(resp.Header.Get("X-Watchgate-Decision"), "budget=watchgate-agents")
	})
	// The reader may not list configmaps: the API server's own 403, passed
	// through, with the decision header of the budget that governed it.
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("watch without RBAC through the proxy: HTTP %d, want the API server's 403", resp.StatusCode)
	}
	// A service account in its own name is governed by the chart's
	// agents budget (impersonation: Direct), not the catch-all.
	if got := resp.Header.Get("X-Watchgate-Decision"); !strings.Contains(got, "budget=watchgate-agents") {
		t.Errorf("X-Watchgate-Decision = %q, want the chart's agents budget", got)
	}

	// What needs the chart's RBAC beyond serving: this replica's entry in
	// the budget's status (server-side apply on watchbudgets/status, every
	// 15 s), the Ready condition and the Lease (leader only).
	apiserver.WaitWhileRunning(t, exited, &waitErr, 90*time.Second, "this replica's status entry, Ready=True and the Lease", func() bool {
		pods, err1 := kubectl(t, "", "get", "wb", "watchgate-default", "-o", "jsonpath={.status.replicas[*].pod}")
		ready, err2 := kubectl(t, "", "get", "wb", "watchgate-default", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		holder, err3 := kubectl(t, "", "get", "lease", "watchgate.watchgate.io", "--namespace", releaseNamespace, "-o", "jsonpath={.spec.holderIdentity}")
		return err1 == nil && err2 == nil && err3 == nil &&
			strings.Contains(pods, "watchgate-packaging-test") && ready == "True" && holder != ""
	})

	// What the API server says when the chart's ServiceAccount lacks a
	// permission (the proxy may log its clients' 403s; those name them).
	// (The log is JSON: the quotes around the user are escaped.)
	denied := regexp.MustCompile(regexp.QuoteMeta("system:serviceaccount:"+releaseNamespace+":watchgate") + `\\*" cannot [a-z]+ resource`)
	if m := denied.FindString(log.String()); m != "" {
		t.Errorf("watchgate logged %q: the chart's RBAC misses a permission the code uses", m)
	}

	// Events: a budget that allows the client one watch open a minute
	// throttles its second; the replica writes an Event about the budget,
	// which the events API puts in default.
	budget := fmt.Sprintf("packaging-events-%d", time.Now().UnixNano())
	kubectlIn(t, fmt.Sprintf(`apiVersion: watchgate.io/v1alpha1
kind: WatchBudget
metadata:
  name: %s
spec:
  precedence: 1
  subjects: [{kind: ServiceAccount, namespace: packaging-client, name: reader}]
  limits: {watchOpensPerMinute: 1, watchBurst: 1}
`, budget), "apply", "-f", "-")
	t.Cleanup(func() { _, _ = kubectl(t, "", "delete", "wb", budget, "--ignore-not-found") })
	apiserver.WaitWhileRunning(t, exited, &waitErr, 60*time.Second, "a watch throttled by "+budget, func() bool {
		resp, err := client.Do(req.Clone(t.Context()))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusTooManyRequests && strings.Contains(resp.Header.Get("X-Watchgate-Decision"), "budget="+budget)
	})
	apiserver.WaitWhileRunning(t, exited, &waitErr, 60*time.Second, "an Event about "+budget+" in default", func() bool {
		out, err := kubectl(t, "", "get", "events.events.k8s.io", "--namespace", "default",
			"-o", `jsonpath={range .items[*]}{.regarding.name}/{.reportingController}{"\n"}{end}`)
		return err == nil && strings.Contains(out, budget+"/watchgate")
	})

	// The leader lists its replicas' pods (to prune their status entries)
	// only once a minute, later than this test looks, and every replica
	// watches pods cluster-wide (the deletions that revoke tokens): ask
	// the API server, with the ServiceAccount's own token, that it may
	// list pods, and write Events only where they belong.
	for _, q := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "pods", "--namespace", releaseNamespace}, "yes"},
		{[]string{"watch", "pods", "--all-namespaces"}, "yes"},
		{[]string{"watch", "nodes", "--all-namespaces"}, "yes"},
		{[]string{"watch", "serviceaccounts", "--all-namespaces"}, "yes"},
		{[]string{"list", "secrets", "--all-namespaces"}, "no"},
		{[]string{"create", "events.events.k8s.io", "--namespace", "default"}, "yes"},
		{[]string{"patch", "events.events.k8s.io", "--namespace", "default"}, "yes"},
		{[]string{"create", "events.events.k8s.io", "--namespace", releaseNamespace}, "no"},
		{[]string{"create", "events.events.k8s.io", "--namespace", "kube-system"}, "no"},
		{[]string{"create", "events.events.k8s.io", "--all-namespaces"}, "no"},
		{[]string{"create", "events", "--namespace", releaseNamespace}, "yes"},
		{[]string{"create", "events", "--namespace", "default"}, "no"},
		{[]string{"create", "events", "--namespace", "kube-system"}, "no"},
	} {
		// kubectl auth can-i exits 1 on "no"; the answer is what counts.
		out, _ := env.KubectlAs(t.Context(), kubeconfig, append([]string{"auth", "can-i"}, q.args...)...)
		if got := strings.TrimSpace(out); !strings.HasPrefix(got, q.want) {
			t.Errorf("the chart's ServiceAccount: can-i %s = %q, want %s", strings.Join(q.args, " "), got, q.want)
		}
	}
}

// kubectlIn runs kubectl as the admin with in on stdin and fails the test on
// an error.
func kubectlIn(t *testing.T, in string, args ...string) {
	t.Helper()
	if out, err := kubectl(t, in, args...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// freeAddress returns a loopback address with a port nothing listens on.
func freeAddress(t *testing.T) string {
	t.Helper()
	addr, err := apiserver.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}
