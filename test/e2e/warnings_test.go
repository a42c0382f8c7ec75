package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

// kubectl tells its user what a budget did: a DryRun budget that would have
// rejected a list, and an Enforce budget that rejected one (which kubectl's
// client-go retried by itself after Retry-After), each print a "Warning:"
// line on stderr.
func TestKubectlPrintsBudgetWarnings(t *testing.T) {
	ns := uniqueName("warnings")
	dry := serviceAccount(t, ns, "dry", readWatch("configmaps"))
	strict := serviceAccount(t, ns, "strict", readWatch("configmaps"))
	oneList := ratelimit.Limits{WatchOpensPerMinute: 600, WatchBurst: 100, ListsPerMinute: 6, ListBurst: 1}
	p := startProxy(t,
		ratelimit.Budget{
			Name: "dry-lists", Precedence: 1, Enforcement: ratelimit.DryRun, Limits: oneList,
			Subjects: []ratelimit.Subject{{Kind: ratelimit.ServiceAccount, Namespace: ns, Name: "dry"}},
		},
		ratelimit.Budget{
			Name: "strict-lists", Precedence: 1, Enforcement: ratelimit.Enforce, Limits: oneList,
			Subjects: []ratelimit.Subject{{Kind: ratelimit.ServiceAccount, Namespace: ns, Name: "strict"}},
		},
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// kubectlStderr runs kubectl get configmaps as sa's token twice, at
	// once, and returns the second run's stderr.
	kubectlStderr := func(token string) string {
		t.Helper()
		kubeconfig, err := apiserver.WriteKubeconfig(p.Config(token, false), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		var stderr string
		for range 2 {
			cmd := exec.CommandContext(ctx, filepath.Join(env.AssetsDir, "kubectl"), "--kubeconfig="+kubeconfig,
				"get", "configmaps", "-n", ns, "-o", "name")
			var errOut strings.Builder
			cmd.Stderr = &errOut
			if err := cmd.Run(); err != nil {
				t.Fatalf("kubectl get configmaps: %v: %s", err, errOut.String())
			}
			stderr = errOut.String()
		}
		return stderr
	}

	if got, want := kubectlStderr(dry.Token), `Warning: watchgate budget "dry-lists" (DryRun) would have rejected this list: too many watch or list requests`; !strings.Contains(got, want) {
		t.Errorf("kubectl stderr under a DryRun budget = %q, want it to contain %q", got, want)
	}
	// The second list is rejected with a Retry-After of up to 10 s; client-go
	// retries it silently, and the admitted retry repeats the rejection's
	// warning.
	if got, want := kubectlStderr(strict.Token), `Warning: watchgate budget "strict-lists" rejected an earlier list: too many watch or list requests; retried after `; !strings.Contains(got, want) {
		t.Errorf("kubectl stderr under an Enforce budget = %q, want it to contain %q", got, want)
	}
}

// kubectl tells its user when the replica's own guard refused its watch:
// `kubectl get -w` over --max-watches-per-identity is answered 429, which
// client-go retries by itself after Retry-After; the retry that gets in
// repeats the refusal's warning, and kubectl prints it.
func TestKubectlPrintsGuardWarnings(t *testing.T) {
	ns := uniqueName("guard-warnings")
	sa := serviceAccount(t, ns, "hoarder", readWatch("configmaps"))
	p := startProxyWith(t, func(o *proxy.Options) { o.MaxWatchesPerIdentity = 1 }, generous("everyone", 100))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(p.Config(sa.Token, false))
	if err != nil {
		t.Fatal(err)
	}
	// The caller's one watch: the guard admitted it once its 200 is back.
	held, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Stop()

	kubeconfig, err := apiserver.WriteKubeconfig(p.Config(sa.Token, false), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	refused := func() float64 {
		return proxyMetric(t, "watchgate_proxy_guard_rejections_total", map[string]string{"reason": proxy.GuardMaxWatchesPerIdentity})
	}
	before := refused()
	kctx, stop := context.WithCancel(ctx)
	defer stop()
	cmd := exec.CommandContext(kctx, filepath.Join(env.AssetsDir, "kubectl"), "--kubeconfig="+kubeconfig,
		"get", "configmaps", "-n", ns, "-o", "name", "--watch-only")
	var stderr apiserver.LockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() { stop(); <-done }()

	eventually(t, 30*time.Second, "kubectl's watch refused", func() (bool, error) { return refused() > before, nil })
	held.Stop()
	want := `Warning: watchgate refused an earlier watch on this replica (MaxWatchesPerIdentity: you hold --max-watches-per-identity=1 watches); retried after 5s`
	eventually(t, 30*time.Second, "kubectl prints the guard's warning", func() (bool, error) {
		select {
		case <-done:
			return false, fmt.Errorf("kubectl ended: %s", stderr.String())
		default:
		}
		return strings.Contains(stderr.String(), want), fmt.Errorf("stderr %q", stderr.String())
	})
}
