package cluster

import (
	"bytes"
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/watchgate/watchgate/test/apiserver"
)

// TestReinstallKeepsRoutedPodsTLS uninstalls the release under a running
// routed agent and installs it again with the values it had, as
// docs/operators.md says: the CA survives the uninstall, so the agent, which still trusts the CA it was given, lists
// and watches again through the new replicas as soon as they serve (not
// after client-go re-reads its CA file minutes later).
func TestReinstallKeepsRoutedPodsTLS(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := labelledNamespace(t, ctx)
	startAgent(t, ctx, ns)
	waitForLog(t, ctx, ns, "agent", "synced\n")
	before, err := cl.Clientset.CoreV1().Secrets(releaseNS).Get(ctx, "watchgate-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	release.mu.Lock()
	defer release.mu.Unlock()
	if _, err := apiserver.Helm(ctx, helm, cl.Kubeconfig, "uninstall", releaseName, "-n", releaseNS, "--wait"); err != nil {
		release.err = err
		t.Fatal(err)
	}
	// Installed again with the values it had (injection on in the install
	// itself): the certificate must carry the same names, so the chart
	// reuses the kept Secret.
	start := time.Now()
	if _, release.err = apiserver.Helm(ctx, helm, cl.Kubeconfig, "install", releaseName, chartPath(),
		"--namespace", releaseNS, "--create-namespace", "--wait", "--set", "injection.enabled=true"); release.err != nil {
		t.Fatalf("install again: %v", release.err)
	}
	t.Logf("reinstalled in %.1fs", time.Since(start).Seconds())
	after, err := cl.Clientset.CoreV1().Secrets(releaseNS).Get(ctx, "watchgate-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before.Data["ca.crt"], after.Data["ca.crt"]) {
		t.Errorf("the reinstall issued a new CA: routed pods, which trust the old one, fail TLS until client-go re-reads ca.crt")
	}
	probe := "after-reinstall-" + utilrand.String(5)
	if _, err := cl.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: probe}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seen := time.Now()
	waitForLog(t, ctx, ns, "agent", "add "+probe+"\n")
	t.Logf("the agent saw a ConfigMap created after the reinstall %.1fs later", time.Since(seen).Seconds())
}
