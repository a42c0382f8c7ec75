package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/watchgate/watchgate/test/apiserver"
)

// TestHelmInstallWaitAsDocumented installs the chart with its default
// values as docs/operators.md says, with --wait and nothing around it, and
// finds what the docs promise running: both replicas of the image the chart
// names, the budgets, injection's webhook after the documented upgrade.
func TestHelmInstallWaitAsDocumented(t *testing.T) {
	ensureRelease(t)
	t.Logf("helm install --wait took %.1fs; the upgrade turning injection on and its rollout %.1fs",
		release.installed.Seconds(), release.injection.Seconds())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	d, err := cl.Clientset.AppsV1().Deployments(releaseNS).Get(ctx, deployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Status.ReadyReplicas != 2 || *d.Spec.Replicas != 2 {
		t.Errorf("deployment %s: %d of %d replicas ready, the chart's default is 2 ready", deployment, d.Status.ReadyReplicas, *d.Spec.Replicas)
	}
	pods, err := cl.Clientset.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: selector(d.Spec.Selector.MatchLabels)})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if got := p.Spec.Containers[0].Image; got != imageRef {
			t.Errorf("pod %s runs %s, want make image's %s", p.Name, got, imageRef)
		}
	}
	// watchgate's leader creates the default budgets once it is elected.
	var wb string
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		wb, err = cl.Kubectl(ctx, "get", "wb", "-o", "name")
		return err == nil && len(strings.Fields(wb)) >= 3, nil
	}); err != nil {
		t.Fatalf("kubectl get wb: %q (%v), want the three default budgets watchgate's leader creates", wb, err)
	}
	// docs/operators.md's table of what the install creates names every
	// budget the chart created.
	docs, err := os.ReadFile(filepath.Join(apiserver.RepoRoot(), "docs", "operators.md"))
	if err != nil {
		t.Fatal(err)
	}
	budgets := strings.Fields(strings.ReplaceAll(wb, "watchbudget.watchgate.io/", ""))
	if len(budgets) < 2 {
		t.Errorf("kubectl get wb: %q, want the chart's budgets", wb)
	}
	for _, b := range budgets {
		if !strings.Contains(string(docs), "| WatchBudget `"+b+"` ") {
			t.Errorf("docs/operators.md, Install with Helm: the table does not list the WatchBudget %s the chart created", b)
		}
	}
	if _, err := cl.Clientset.CoreV1().Services(releaseNS).Get(ctx, webhookService, metav1.GetOptions{}); err != nil {
		t.Errorf("injection's Service: %v", err)
	}
}

func selector(labels map[string]string) string {
	var parts []string
	for k, v := range labels {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}
