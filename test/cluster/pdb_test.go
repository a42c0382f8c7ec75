package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestPodDisruptionBudgetRefusesEvictingTheLastReadyReplica: with one
// replica not ready (its process stopped with SIGSTOP on the node, so its
// readiness probe fails), the API server refuses to evict the other, the
// only one serving, with 429 (the PodDisruptionBudget, minAvailable 1);
// the one that is not ready may be evicted (unhealthyPodEvictionPolicy
// AlwaysAllow; asked as a dry run, so it stays).
func TestPodDisruptionBudgetRefusesEvictingTheLastReadyReplica(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cs := cl.Clientset
	release.mu.Lock()
	defer release.mu.Unlock()
	pods := replicaPods(t, ctx)
	if len(pods) != 2 {
		t.Fatalf("%d ready replicas, want the chart's 2", len(pods))
	}
	stopped, other := pods[0], pods[1]
	pid := replicaPID(t, stopped)
	t.Logf("SIGSTOP to replica %s (PID %d on the node)", stopped.Name, pid)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()

	// The disruption controller sees one healthy pod of the one required.
	var pdb *policyv1.PodDisruptionBudget
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		pdb, err = cs.PolicyV1().PodDisruptionBudgets(releaseNS).Get(ctx, deployment, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return pdb.Status.CurrentHealthy == 1 && pdb.Status.DisruptionsAllowed == 0, nil
	}); err != nil {
		t.Fatalf("the PodDisruptionBudget never counted the stopped replica out: %v (status %+v)", err, pdb.Status)
	}

	err := cs.PolicyV1().Evictions(releaseNS).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: other.Name, Namespace: releaseNS}})
	if !apierrors.IsTooManyRequests(err) {
		t.Errorf("evicting %s, the only ready replica: %v, want 429 (the PodDisruptionBudget)", other.Name, err)
	} else {
		t.Logf("evicting the only ready replica: %v", err)
	}
	err = cs.PolicyV1().Evictions(releaseNS).Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: stopped.Name, Namespace: releaseNS},
		DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}},
	})
	if err != nil {
		t.Errorf("evicting %s, which is not ready (dry run): %v, want allowed", stopped.Name, err)
	}
	resume()
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		return len(replicaPods(t, ctx)) == 2, nil
	}); err != nil {
		t.Fatalf("the stopped replica did not come back: %v", err)
	}
}

// replicaPID is the node's PID of p's first container's process.
func replicaPID(t *testing.T, p corev1.Pod) int {
	t.Helper()
	_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
	b, err := os.ReadFile(filepath.Join(cl.Dir, "containerd", "state", "io.containerd.runtime.v2.task", "k8s.io", id, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
