package e2e

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/cert"

	topv1alpha1 "github.com/watchgate/watchgate/api/top/v1alpha1"
	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

// mayGetBudgetStatus is what reading the top endpoint takes.
var mayGetBudgetStatus = rbacv1.PolicyRule{APIGroups: []string{"watchgate.io"}, Resources: []string{"watchbudgets/status"}, Verbs: []string{"get"}}

// recordingUpstream is an HTTPS server that answers /readyz (the proxy's
// readiness probe) and records the path of every other request, as the
// upstream of a proxy whose reviews go to the real API server.
type recordingUpstream struct {
	*httptest.Server
	mu    sync.Mutex
	paths []string
}

func newRecordingUpstream(t *testing.T) *recordingUpstream {
	t.Helper()
	u := &recordingUpstream{}
	u.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			u.mu.Lock()
			u.paths = append(u.paths, r.URL.Path)
			u.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(u.Close)
	return u
}

// config reaches the recorder, trusting its certificate.
func (u *recordingUpstream) config() *rest.Config {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.Certificate().Raw})
	return &rest.Config{Host: u.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
}

func (u *recordingUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.paths)
}

// topProxy starts a proxy in front of a recordingUpstream, its reviews
// (TokenReviews, SubjectAccessReviews, service-account keys) at the real
// API server, with one budget "agents" in whose engine "greedy" was
// refused twice and holds a watch.
func topProxy(t *testing.T) (*testProxy, *recordingUpstream) {
	t.Helper()
	up := newRecordingUpstream(t)
	agents := generous("agents", 10)
	agents.Limits.WatchOpensPerMinute, agents.Limits.WatchBurst = 60, 1
	p := startProxyWith(t, func(o *proxy.Options) {
		o.Upstream, o.Reviews = up.config(), env.Config
		o.ReplicaName = "watchgate-0"
	}, agents)
	now := time.Now()
	for range 3 {
		p.Engine.Decide(now, &ratelimit.Request{User: "greedy", Verb: ratelimit.VerbWatch, Resource: "configmaps"})
	}
	return p, up
}

// The top endpoint, with the real API server's authentication and
// authorization: a user who may get watchbudgets/status reads the
// ranking, a user who may not gets 403, no token 401, all as Status
// bodies, and nothing under /.watchgate/ is forwarded upstream.
func TestTopEndpointAuthorizesWithTheAPIServer(t *testing.T) {
	ns := uniqueName("top")
	reader := serviceAccount(t, ns, "reader", mayGetBudgetStatus)
	outsider := serviceAccount(t, ns, "outsider", readWatch("configmaps"))
	oneBudget := mayGetBudgetStatus
	oneBudget.ResourceNames = []string{"agents"}
	agentsOnly := serviceAccount(t, ns, "agents-only", oneBudget)
	p, up := topProxy(t)

	for name, tc := range map[string]struct {
		token, query string
		code         int
		reason       metav1.StatusReason
	}{
		"a user who may get watchbudgets/status reads it":                   {token: reader.Token, code: http.StatusOK},
		"one budget, by opens":                                              {token: reader.Token, query: "?budget=agents&sort=opens", code: http.StatusOK},
		"a user who may not is 403":                                         {token: outsider.Token, code: http.StatusForbidden, reason: metav1.StatusReasonForbidden},
		"a user who may get one budget's status reads that budget":          {token: agentsOnly.Token, query: "?budget=agents", code: http.StatusOK},
		"a user who may get one budget's status does not read every budget": {token: agentsOnly.Token, code: http.StatusForbidden, reason: metav1.StatusReasonForbidden},
		"no token is 401":                                                   {code: http.StatusUnauthorized, reason: metav1.StatusReasonUnauthorized},
		"a token the API server does not know is 401":                       {token: "not-a-token", code: http.StatusUnauthorized, reason: metav1.StatusReasonUnauthorized},
		"a bad query from a user who may read it is 400":                    {token: reader.Token, query: "?sort=names", code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest},
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := rawGet(t, p, tc.token, topv1alpha1.Path+tc.query, nil)
			if resp.StatusCode != tc.code {
				t.Fatalf("HTTP %d %s, want %d", resp.StatusCode, body, tc.code)
			}
			if tc.code != http.StatusOK {
				var st metav1.Status
				if err := json.Unmarshal(body, &st); err != nil || st.Kind != "Status" || st.Reason != tc.reason {
					t.Fatalf("body %s, want a Status with reason %s (%v)", body, tc.reason, err)
				}
				return
			}
			var rep topv1alpha1.TopReport
			if err := json.Unmarshal(body, &rep); err != nil {
				t.Fatalf("%v in %s", err, body)
			}
			if rep.Kind != topv1alpha1.Kind || rep.Replica != "watchgate-0" || len(rep.Budgets) != 1 || rep.Budgets[0].Name != "agents" ||
				len(rep.Budgets[0].Identities) != 1 {
				t.Fatalf("report %s, want one budget, agents, listing greedy, from watchgate-0", body)
			}
			if got, want := rep.Budgets[0].Identities[0], (topv1alpha1.IdentityFigures{User: "greedy", Rejections: 2, Opens: 1, Watches: 1}); got != want {
				t.Errorf("greedy's figures %+v, want %+v", got, want)
			}
		})
	}

	// The recorder is a working upstream: an API path reaches it.
	if resp, body := rawGet(t, p, reader.Token, "/version", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /version through the proxy: HTTP %d %s", resp.StatusCode, body)
	}
	seen := up.seen()
	if !slices.Contains(seen, "/version") {
		t.Errorf("the upstream saw %v, want /version among them", seen)
	}
	for _, path := range seen {
		if strings.Contains(path, ".watchgate") {
			t.Errorf("the upstream saw %s: the top endpoint's paths must never be forwarded", path)
		}
	}
}

// buildPlugin builds cmd/kubectl-watchgate into a temporary directory.
func buildPlugin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kubectl-watchgate")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd/kubectl-watchgate")
	build.Dir = apiserver.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kubectl-watchgate: %v\n%s", err, out)
	}
	return bin
}

// runPlugin runs the plugin with args and returns its stdout, stderr and
// exit code.
func runPlugin(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.Env = append(os.Environ(), "KUBECONFIG=/nonexistent")
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run %s: %v", bin, err)
	}
	return out.String(), errOut.String(), code
}

// kubeconfigFor writes a kubeconfig that reaches the API server as cfg
// says and returns its path.
func kubeconfigFor(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	path, err := apiserver.WriteKubeconfig(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// kubeconfigWithUser writes a kubeconfig that reaches the API server as
// user and returns its path.
func kubeconfigWithUser(t *testing.T, user *clientcmdapi.AuthInfo) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
	kc.AuthInfos["test"] = user
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeTempFile writes content to a new file named name and returns its
// path.
func writeTempFile(t *testing.T, name, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// execPluginPrinting is a client-go exec credential plugin, a shell
// script, that prints token.
func execPluginPrinting(t *testing.T, token string) *clientcmdapi.ExecConfig {
	t.Helper()
	script := writeTempFile(t, "credential.sh", "#!/bin/sh\n"+
		`echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"`+token+`"}}'`+"\n", 0o700)
	return &clientcmdapi.ExecConfig{Command: script, APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
}

// The built plugin against a real replica (a proxy in front of the real
// API server, serving a certificate for watchgate.<namespace>.svc whose CA
// is published in the namespace's watchgate-root-ca.crt), reached at
// --replica-url: the test bed has no kubelet, so port-forward cannot
// reach a pod (TestPluginPortForwardsThroughTheAPIServer goes as far as it
// can).
func TestPluginTop(t *testing.T) {
	bin := buildPlugin(t)
	ctx := t.Context()
	ns := uniqueName("top-plugin")
	reader := serviceAccount(t, ns, "reader", mayGetBudgetStatus, readCA)
	outsider := serviceAccount(t, ns, "outsider", readCA)

	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("watchgate."+ns+".svc", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := errors.Join(os.WriteFile(certFile, certPEM, 0o600), os.WriteFile(keyFile, keyPEM, 0o600)); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "watchgate-root-ca.crt"}, Data: map[string]string{"ca.crt": string(certPEM)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agents := generous("agents", 10)
	agents.Limits.WatchOpensPerMinute, agents.Limits.WatchBurst = 60, 1
	p := startProxyWith(t, func(o *proxy.Options) {
		o.CertFile, o.KeyFile, o.ReplicaName = certFile, keyFile, "watchgate-0"
	}, agents)
	now := time.Now()
	for _, u := range []string{"greedy", "greedy", "greedy", "holder"} {
		p.Engine.Decide(now, &ratelimit.Request{User: u, Verb: ratelimit.VerbWatch, Resource: "configmaps"})
	}
	base := []string{"top", "-n", ns, "--replica-url", p.URL}

	t.Run("a table, by open watches", func(t *testing.T) {
		out, errOut, code := runPlugin(t, bin, append(base, "--kubeconfig", kubeconfigFor(t, env.ConfigFor(reader.Token, "", nil)), "--sort", "watches")...)
		if code != 0 {
			t.Fatalf("exit %d, stderr %s", code, errOut)
		}
		want := "BUDGET REPLICA IDENTITY REJECTIONS OPENS WATCHES\n" +
			"agents watchgate-0 greedy 2 1 1\n" +
			"agents watchgate-0 holder 0 1 1\n"
		if got := squeezeSpaces(out); got != want {
			t.Errorf("table:\n%s\nwant (spaces squeezed)\n%s", out, want)
		}
	})
	// The kubeconfig's other bearer credentials: a token file, and an
	// exec plugin that prints the token, each sent through client-go's
	// transport.
	for name, user := range map[string]*clientcmdapi.AuthInfo{
		"a token file":   {TokenFile: writeTempFile(t, "token", reader.Token, 0o600)},
		"an exec plugin": {Exec: execPluginPrinting(t, reader.Token)},
	} {
		t.Run(name, func(t *testing.T) {
			out, errOut, code := runPlugin(t, bin, append(base, "--kubeconfig", kubeconfigWithUser(t, user))...)
			if code != 0 || !strings.Contains(squeezeSpaces(out), "agents watchgate-0 greedy 2 1 1") {
				t.Errorf("exit %d, stdout %q, stderr %q; want greedy's row", code, out, errOut)
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		out, errOut, code := runPlugin(t, bin, append(base, "--kubeconfig", kubeconfigFor(t, env.ConfigFor(reader.Token, "", nil)), "-o", "json", "--budget", "agents")...)
		if code != 0 {
			t.Fatalf("exit %d, stderr %s", code, errOut)
		}
		var list struct {
			Kind  string                  `json:"kind"`
			Items []topv1alpha1.TopReport `json:"items"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("%v in %s", err, out)
		}
		if list.Kind != "List" || len(list.Items) != 1 || list.Items[0].Replica != "watchgate-0" || list.Items[0].Sort != topv1alpha1.SortRejections ||
			len(list.Items[0].Budgets) != 1 || len(list.Items[0].Budgets[0].Identities) != 1 || list.Items[0].Budgets[0].Identities[0].User != "greedy" {
			t.Errorf("-o json:\n%s\nwant a List of one report from watchgate-0 listing greedy in agents", out)
		}
	})
	for name, tc := range map[string]struct {
		args []string
		want string // in stderr
	}{
		"a user who may not get watchbudgets/status is refused": {
			[]string{"--kubeconfig", kubeconfigFor(t, env.ConfigFor(outsider.Token, "", nil))}, "cannot get resource \"watchbudgets/status\""},
		"a kubeconfig with a client certificate and no token is told a token is needed": {
			[]string{"--kubeconfig", kubeconfigFor(t, certificateOnly(env.Config))}, "no bearer token"},
		"a certificate not issued for the name verified is refused": {
			[]string{"--kubeconfig", kubeconfigFor(t, env.ConfigFor(reader.Token, "", nil)), "--replica-server-name", "other.example"}, "certificate"},
	} {
		t.Run(name, func(t *testing.T) {
			out, errOut, code := runPlugin(t, bin, append(base, tc.args...)...)
			if code != 1 || !strings.Contains(errOut, tc.want) || out != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 1, nothing on stdout and %q on stderr", code, out, errOut, tc.want)
			}
		})
	}
}

// readCA is what the plugin needs to read the published CA.
var readCA = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"watchgate-root-ca.crt"}, Verbs: []string{"get"}}

// certificateOnly is cfg's client certificate without any token.
func certificateOnly(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.BearerToken, c.BearerTokenFile = "", ""
	return c
}

// squeezeSpaces turns every run of spaces into one and trims them at
// lines' ends.
func squeezeSpaces(s string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		nl := strings.HasSuffix(line, "\n")
		b.WriteString(strings.Join(strings.Fields(line), " "))
		if nl {
			b.WriteString("\n")
		}
	}
	return b.String()
}

// Without --replica-url the plugin finds the replicas as the running pods
// the proxy Service selects and port-forwards to each one's https port
// through the API server with the user's credentials. The test bed has no
// kubelet: the test checks that the plugin found the pod and its named
// port and asked the API server for the port-forward, which the API
// server refuses for a user without create on pods/portforward and cannot
// carry out (no node) for one with it.
func TestPluginPortForwardsThroughTheAPIServer(t *testing.T) {
	bin := buildPlugin(t)
	ctx := t.Context()
	ns := uniqueName("top-forward")
	discover := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services", "pods"}, Verbs: []string{"get", "list"}}
	forwarder := serviceAccount(t, ns, "forwarder", mayGetBudgetStatus, readCA, discover,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/portforward"}, Verbs: []string{"create"}})
	lister := serviceAccount(t, ns, "lister", mayGetBudgetStatus, readCA, discover)
	serviceAccount(t, ns, "default")

	cs := env.Clientset
	ca, _, err := cert.GenerateSelfSignedCertKey("watchgate."+ns+".svc", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "watchgate-root-ca.crt"}, Data: map[string]string{"ca.crt": string(ca)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	selector := map[string]string{"app.kubernetes.io/name": "watchgate", "app.kubernetes.io/instance": "watchgate"}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "watchgate"},
		Spec: corev1.ServiceSpec{Selector: selector, Ports: []corev1.ServicePort{
			{Name: "https", Port: 443, TargetPort: intstr.FromString("https")},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, running bool) {
		p, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: selector},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "watchgate", Image: "watchgate", Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 8443}},
			}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if running {
			p.Status.Phase = corev1.PodRunning
			if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	pod("watchgate-pending", false)
	pod("watchgate-running", true)

	for name, tc := range map[string]struct {
		sa   apiserver.ServiceAccount
		want string
	}{
		"a user without create on pods/portforward is refused by the API server":    {lister, "forbidden"},
		"a user with it reaches the API server, which has no kubelet to forward to": {forwarder, ""},
	} {
		t.Run(name, func(t *testing.T) {
			out, errOut, code := runPlugin(t, bin, "top", "-n", ns, "--kubeconfig", kubeconfigFor(t, env.ConfigFor(tc.sa.Token, "", nil)))
			prefix := "error: replica watchgate-running: port-forward to pod watchgate-running port 8443: "
			if code != 1 || out != "" || !strings.HasPrefix(errOut, prefix) || strings.Contains(errOut, "watchgate-pending") {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and only %q…", code, out, errOut, prefix)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q, want the API server's answer %q in it", errOut, tc.want)
			}
		})
	}
}
