package cluster

import (
	"context"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestSIGKILLedReplicaClientsServedWithinSeconds kills the replica that
// serves a routed agent with SIGKILL (no drain, no goodbye): the agent's
// watch breaks, and it is served again, by whichever replica kube-proxy
// sends it to, within seconds.
func TestSIGKILLedReplicaClientsServedWithinSeconds(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := labelledNamespace(t, ctx)
	startAgent(t, ctx, ns)
	waitForLog(t, ctx, ns, "agent", "synced\n")
	agent := "system:serviceaccount:" + ns + ":agent"
	reader := topReader(t, ctx)
	secret, err := cl.Clientset.CoreV1().Secrets(releaseNS).Get(ctx, "watchgate-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var serving corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, p := range replicaPods(t, ctx) {
			report, err := top(ctx, p, reader, secret.Data["ca.crt"])
			if err != nil {
				return false, err
			}
			for _, b := range report.Budgets {
				for _, id := range b.Identities {
					if id.User == agent && id.Watches >= 1 {
						serving = p
						return true, nil
					}
				}
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no replica serves the agent's watch: %v", err)
	}

	pid := replicaPID(t, serving)
	t.Logf("SIGKILL to replica %s (PID %d on the node), which serves %s", serving.Name, pid, agent)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	probe := "after-sigkill-" + utilrand.String(5)
	if _, err := cl.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: probe}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, ctx, ns, "agent", "add "+probe+"\n")
	took := time.Since(killed)
	t.Logf("the agent saw a ConfigMap created after the SIGKILL %.1fs later", took.Seconds())
	if took > 30*time.Second {
		t.Errorf("the agent was served again %.1fs after its replica was killed, want within 30s", took.Seconds())
	}
	// Leave two ready replicas for the next test.
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		return len(replicaPods(t, ctx)) == 2, nil
	}); err != nil {
		t.Fatalf("the killed replica did not come back: %v", err)
	}
}
