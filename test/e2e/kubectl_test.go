package e2e

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchgate/watchgate/test/apiserver"
)

// kubectl, the other real client operators use, works through the proxy
// with nothing changed but the server in its kubeconfig: it gets, watches
// and is refused exactly as it would be directly.
func TestKubectlThroughProxy(t *testing.T) {
	p := startProxy(t, generous("kubectl", 10))
	ns := uniqueName("kubectl")
	sa := serviceAccount(t, ns, "operator", readWatch("configmaps"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	viaProxy, err := apiserver.WriteKubeconfig(p.Config(sa.Token, false), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	direct, err := apiserver.WriteKubeconfig(env.ConfigFor(sa.Token, "", nil), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}

	got, err := env.KubectlAs(ctx, viaProxy, "get", "configmaps", "-n", ns, "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := env.KubectlAs(ctx, direct, "get", "configmaps", "-n", ns, "-o", "name"); got != want || !strings.Contains(got, "configmap/before") {
		t.Errorf("kubectl get through the proxy = %q, directly = %q; want the same, naming configmap/before", got, want)
	}

	// The same refusal, from the API server, through the proxy.
	refusedVia, errVia := env.KubectlAs(ctx, viaProxy, "get", "secrets", "-n", ns)
	refusedDirect, errDirect := env.KubectlAs(ctx, direct, "get", "secrets", "-n", ns)
	if errVia == nil || errDirect == nil {
		t.Fatalf("kubectl get secrets succeeded (via proxy: %v, directly: %v), want both refused", errVia, errDirect)
	}
	if !strings.Contains(refusedVia, "Forbidden") || refusedVia != refusedDirect {
		t.Errorf("refusal through the proxy = %q, directly = %q; want the same Forbidden", refusedVia, refusedDirect)
	}

	// kubectl get --watch-only sees a ConfigMap created after it started.
	cmd := exec.CommandContext(ctx, filepath.Join(env.AssetsDir, "kubectl"), "--kubeconfig="+viaProxy,
		"get", "configmaps", "-n", ns, "--watch-only", "-o", "name")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan string)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
	}()
	// Keep creating until the watch is open and reports one: kubectl gives
	// no sign of when its watch started.
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("kubectl --watch-only ended before it saw a new ConfigMap")
			}
			if strings.HasPrefix(line, "configmap/after-") {
				return
			}
		case <-tick.C:
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: uniqueName("after")}}
			if _, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("kubectl --watch-only through the proxy saw no new ConfigMap within a minute")
		}
	}
}
