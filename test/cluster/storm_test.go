package cluster

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/api/v1alpha1"

	"github.com/watchgate/watchgate/inject"
	"github.com/watchgate/watchgate/test/apiserver"
)

// TestSeedStormFromPods is the seed incident on a cluster: an agent that
// impersonates its users, as Rancher's does, runs in a pod, and each of
// its 20 users' dashboards re-subscribes the moment its watch ends, from
// one of 3 resourceVersions the API server has declared too old. Under
// the budget docs/operators.md suggests for dashboard users behind Rancher
// (Enforce, the impersonated users dashboard-*; the chart's own budgets
// are DryRun, which forwards), the storm from a routed pod costs the API
// server at most one WATCH per stale version, counted by the API server
// itself (apiserver_request_total); the same agent in a pod that is not
// routed costs one WATCH per attempt.
func TestSeedStormFromPods(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	routed := labelledNamespace(t, ctx)
	direct := plainNamespace(t, ctx)
	agentMayImpersonateUsers(t, ctx, routed, direct)
	loaded := dashboardBudget(t, ctx)
	versions := staleVersions(t, ctx, routed, 3)
	loaded()
	t.Logf("stale resourceVersions %v", versions)

	s := runStorm(t, ctx, routed, versions, 20, 10*time.Second)
	t.Logf("through watchgate: %d re-subscriptions, %d answered 410 Expired; the API server counted %v WATCH requests", s.attempts, s.expired, s.upstream)
	if s.upstream < 1 || s.upstream > float64(len(versions)) {
		t.Errorf("the API server counted %v WATCH requests for %d stale versions through watchgate, want 1 to %d",
			s.upstream, len(versions), len(versions))
	}
	// Every dashboard was told its version is too old, again and again.
	if s.expired < 3*20 {
		t.Errorf("%d of %d re-subscriptions were answered 410 Expired, want at least 3 for each of the 20 users:\n%s", s.expired, s.attempts, s.log)
	}

	// Without watchgate, every attempt is a WATCH on the API server.
	d := runStorm(t, ctx, direct, versions, 5, 3*time.Second)
	t.Logf("directly: %d re-subscriptions, %d answered 410 Expired; the API server counted %v WATCH requests", d.attempts, d.expired, d.upstream)
	if d.upstream < float64(d.expired) || d.expired < 5 {
		t.Errorf("directly, the API server counted %v WATCH requests for %d re-subscriptions answered 410, want at least as many", d.upstream, d.expired)
	}
}

// stormResult is what one run of test/cluster/storm did, as it counted,
// and how many WATCH requests on podtemplates the API server counted.
type stormResult struct {
	attempts, expired int
	upstream          float64
	log               string
}

// runStorm runs test/cluster/storm in ns (a routed pod when ns is
// labelled) with users dashboards on versions for d, and waits until the
// API server has counted at least one WATCH request (for a routed pod) or
// one for each attempt it answered 410.
func runStorm(t *testing.T, ctx context.Context, ns string, versions []string, users int, d time.Duration) stormResult {
	t.Helper()
	cs := cl.Clientset
	before := podTemplateWatches(t, ctx)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "cattle-cluster-agent"},
		Spec: corev1.PodSpec{
			ServiceAccountName: "cattle-cluster-agent",
			RestartPolicy:      corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "agent", Image: stormImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"-users", fmt.Sprint(users), "-resource-versions", strings.Join(versions, ","), "-duration", d.String()},
			}},
		},
	}
	created, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n, _ := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if wantRouted := n.Labels[inject.LabelInject] == inject.ValueEnabled; wantRouted != (created.Annotations[inject.AnnotationStatus] == inject.StatusInjected) {
		t.Fatalf("the storm's pod in %s: %s=%q, want routed %v", ns, inject.AnnotationStatus, created.Annotations[inject.AnnotationStatus], wantRouted)
	}
	var phase corev1.PodPhase
	if err := wait.PollUntilContextTimeout(ctx, time.Second, d+2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, nil
	}); err != nil {
		t.Fatalf("the storm's pod in %s did not end: %v (phase %s)", ns, err, phase)
	}
	b, err := cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := stormResult{log: string(b)}
	var other int
	found := false
	for line := range strings.SplitSeq(r.log, "\n") {
		if _, err := fmt.Sscanf(line, "attempts %d expired %d other %d", &r.attempts, &r.expired, &other); err == nil {
			found = true
		}
	}
	if phase != corev1.PodSucceeded || !found {
		t.Fatalf("the storm's pod in %s: phase %s, log:\n%s", ns, phase, r.log)
	}
	// The API server counts a WATCH when it ends: at once for those it
	// answered 410, later for those the client left at the deadline.
	least := float64(r.expired)
	if created.Annotations[inject.AnnotationStatus] == inject.StatusInjected {
		least = 1
	}
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		r.upstream = podTemplateWatches(t, ctx) - before
		return r.upstream >= least, nil
	}); err != nil {
		t.Errorf("the API server counted %v WATCH requests on podtemplates, want at least %v", r.upstream, least)
	}
	return r
}

// podTemplateWatches is the WATCH requests on podtemplates of one
// namespace the API server has counted (apiserver_request_total, scope
// namespace): nothing on the cluster but the storm watches them so.
func podTemplateWatches(t *testing.T, ctx context.Context) float64 {
	t.Helper()
	fams, err := (&apiserver.Env{Clientset: cl.Clientset}).Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return apiserver.Sum(fams, "apiserver_request_total",
		map[string]string{"verb": "WATCH", "group": "", "resource": "podtemplates", "scope": "namespace"})
}

// staleVersions creates n PodTemplates in ns, churns others, and returns
// the n resourceVersions once the API server answers a watch from the
// newest "too old" (the cluster runs with Options.StaleVersions). It asks
// across all namespaces, so its own watches are not counted by
// podTemplateWatches.
func staleVersions(t *testing.T, ctx context.Context, ns string, n int) []string {
	t.Helper()
	cs := cl.Clientset
	pt := func(name string) *corev1.PodTemplate {
		return &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{GenerateName: name}, Template: corev1.PodTemplateSpec{
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: PauseImage}}},
		}}
	}
	var versions []string
	for range n {
		p, err := cs.CoreV1().PodTemplates(ns).Create(ctx, pt("item-"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		versions = append(versions, p.ResourceVersion)
	}
	newest := versions[n-1]
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for range 10 {
			if _, err := cs.CoreV1().PodTemplates(ns).Create(ctx, pt("churn-"), metav1.CreateOptions{}); err != nil {
				return false, err
			}
		}
		a, err := apiserver.WatchFor(ctx, cl.Config, "/api/v1/podtemplates", newest, 2*time.Second)
		return err == nil && a.Code == http.StatusGone, err
	}); err != nil {
		t.Fatalf("resourceVersion %s never went too old: %v", newest, err)
	}
	return versions
}

// agentMayImpersonateUsers gives the service account cattle-cluster-agent
// of each namespace the right to impersonate users, as Rancher's agent
// has, and every authenticated user the right to watch PodTemplates there.
func agentMayImpersonateUsers(t *testing.T, ctx context.Context, namespaces ...string) {
	t.Helper()
	cs := cl.Clientset
	name := "storm-impersonate-" + utilrand.String(5)
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
	}
	for _, ns := range namespaces {
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "cattle-cluster-agent"})
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = cs.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	for _, ns := range namespaces {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "cattle-cluster-agent"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "dashboards"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"podtemplates"}, Verbs: []string{"get", "list", "watch"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "dashboards"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "dashboards"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// dashboardBudget creates an enforced WatchBudget for the impersonated
// users dashboard-* that stops stale-version loops and nothing else; the
// function it returns waits until every replica has loaded it (their
// status says so within DefaultStatusInterval, 15 s).
func dashboardBudget(t *testing.T, ctx context.Context) (loaded func()) {
	t.Helper()
	budgets := dynamic.NewForConfigOrDie(cl.Config).Resource(v1alpha1.GroupVersion.WithResource("watchbudgets"))
	b := &v1alpha1.WatchBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "WatchBudget"},
		ObjectMeta: metav1.ObjectMeta{Name: "dashboard-users-" + utilrand.String(5)},
		Spec: v1alpha1.WatchBudgetSpec{
			Precedence:    100,
			Enforcement:   v1alpha1.EnforcementEnforce,
			Impersonation: v1alpha1.ImpersonationImpersonated,
			Subjects:      []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "dashboard-*"}},
			Limits:        v1alpha1.Limits{WatchOpensPerMinute: ptr.To[int32](0), MaxConcurrentWatches: ptr.To[int32](0)},
			Backoff:       v1alpha1.Backoff{InitialDelaySeconds: ptr.To[int32](0)},
			StaleVersions: v1alpha1.StaleVersions{Action: v1alpha1.StaleActionReject, MemorySeconds: ptr.To[int32](900)},
		},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := budgets.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = budgets.Delete(context.Background(), b.Name, metav1.DeleteOptions{}) })
	return func() {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			u, err := budgets.Get(ctx, b.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, b); err != nil {
				return false, err
			}
			loaded := 0
			for _, r := range b.Status.Replicas {
				if r.ObservedGeneration >= b.Generation {
					loaded++
				}
			}
			return loaded >= 2, nil
		}); err != nil {
			t.Fatalf("the replicas did not load WatchBudget %s: %v (status %+v)", b.Name, err, b.Status.Replicas)
		}
	}
}

// plainNamespace creates a namespace without the injection label, deleted
// when t ends.
func plainNamespace(t *testing.T, ctx context.Context) string {
	t.Helper()
	name := "direct-" + utilrand.String(5)
	if _, err := cl.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Clientset.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cl.Clientset.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("namespace %s has no default ServiceAccount: %v", name, err)
	}
	return name
}
