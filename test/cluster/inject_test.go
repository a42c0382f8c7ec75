package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/inject"
)

// TestInjectionRoutesOnEveryReplica: with the chart's two replicas, every
// pod of a labelled namespace is routed, and still after the leader's pod
// is deleted; and every replica's webhook, asked directly at its pod's IP,
// routes too. (kube-apiserver keeps its connection to one replica, so
// which replica answers the pods' admissions is chance: creating pods
// alone can pass on an install where one replica does not route.)
func TestInjectionRoutesOnEveryReplica(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := labelledNamespace(t, ctx)

	createRoutedPods(t, ctx, ns, "before", 20)
	askEveryReplica(t, ctx, ns)

	leader := leaderPod(t, ctx)
	t.Logf("deleting the leader's pod %s", leader)
	if err := cl.Clientset.CoreV1().Pods(releaseNS).Delete(ctx, leader, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReplicasReady(t, ctx, leader)
	createRoutedPods(t, ctx, ns, "after", 20)
	askEveryReplica(t, ctx, ns)
}

// labelledNamespace creates a namespace with watchgate.io/inject=enabled,
// deleted when t ends.
func labelledNamespace(t *testing.T, ctx context.Context) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   "routed-" + utilrand.String(5),
		Labels: map[string]string{inject.LabelInject: inject.ValueEnabled},
	}}
	if _, err := cl.Clientset.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Clientset.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	// The ServiceAccount admission plugin rejects pods until the
	// namespace's default ServiceAccount exists.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cl.Clientset.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("namespace %s has no default ServiceAccount: %v", ns.Name, err)
	}
	return ns.Name
}

// unscheduledPod is a pod no node takes (its nodeSelector matches none):
// admission is all these tests look at, so the node runs nothing.
func unscheduledPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"watchgate.io/test": "never-scheduled"},
			Containers:   []corev1.Container{{Name: "agent", Image: PauseImage, ImagePullPolicy: corev1.PullNever}},
		},
	}
}

// createRoutedPods creates n pods in ns and fails t for each one the
// webhook did not route.
func createRoutedPods(t *testing.T, ctx context.Context, ns, prefix string, n int) {
	t.Helper()
	unrouted := 0
	for i := range n {
		p, err := cl.Clientset.CoreV1().Pods(ns).Create(ctx, unscheduledPod(fmt.Sprintf("%s-%d", prefix, i)), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Annotations[inject.AnnotationStatus] != inject.StatusInjected {
			unrouted++
		}
	}
	if unrouted > 0 {
		t.Errorf("%s: %d of %d pods of the labelled namespace %s were admitted unrouted (no %s: %s)",
			prefix, unrouted, n, ns, inject.AnnotationStatus, inject.StatusInjected)
	}
}

// askEveryReplica sends each ready replica's webhook, at its pod's IP, the
// admission review kube-apiserver would send for a pod of ns, over TLS
// verified as kube-apiserver verifies it (the webhook configuration's
// caBundle and the Service's name), and fails t for each replica that does
// not route the pod.
func askEveryReplica(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	caBundle := webhookCABundle(t, ctx)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caBundle) {
		t.Fatal("the webhook configuration's caBundle holds no certificate")
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: webhookService + "." + releaseNS + ".svc",
	}}}
	pods := replicaPods(t, ctx)
	if len(pods) != 2 {
		t.Fatalf("%d ready replicas, want the chart's 2", len(pods))
	}
	for _, p := range pods {
		resp, err := review(ctx, client, "https://"+net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(containerPort(p, "webhook"))))+inject.WebhookPath, ns)
		switch {
		case err != nil:
			t.Errorf("replica %s: %v", p.Name, err)
		case !resp.Allowed || !bytes.Contains(resp.Patch, []byte(inject.VolumeName)):
			t.Errorf("replica %s did not route a pod of the labelled namespace %s: allowed %v, warnings %q, patch %s",
				p.Name, ns, resp.Allowed, resp.Warnings, resp.Patch)
		}
	}
}

// review posts one pod's admission review and returns the response.
func review(ctx context.Context, client *http.Client, url, ns string) (*admissionv1.AdmissionResponse, error) {
	pod := unscheduledPod("asked-directly")
	pod.Namespace = ns
	// What the ServiceAccount admission plugin adds before mutating
	// webhooks run, as on every pod of a real cluster.
	pod.Spec.ServiceAccountName = "default"
	pod.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](0o644),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace",
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
	}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access-abcde", ReadOnly: true,
		MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}}
	raw, err := json.Marshal(pod)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID(utilrand.String(10)),
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: ns, Name: pod.Name, Operation: admissionv1.Create,
			Object: runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	if out.Response == nil {
		return nil, fmt.Errorf("no response in %s", b)
	}
	return out.Response, nil
}

// webhookCABundle is the caBundle kube-apiserver trusts for the release's
// injection webhook.
func webhookCABundle(t *testing.T, ctx context.Context) []byte {
	t.Helper()
	list, err := cl.Clientset.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Items {
		for _, w := range c.Webhooks {
			if s := w.ClientConfig.Service; s != nil && s.Namespace == releaseNS && s.Name == webhookService {
				return w.ClientConfig.CABundle
			}
		}
	}
	t.Fatalf("no mutating webhook calls the Service %s/%s", releaseNS, webhookService)
	return nil
}

// replicaPods are the proxy Deployment's ready pods that are not being
// deleted.
func replicaPods(t *testing.T, ctx context.Context) []corev1.Pod {
	t.Helper()
	d, err := cl.Clientset.AppsV1().Deployments(releaseNS).Get(ctx, deployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := cl.Clientset.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: selector(d.Spec.Selector.MatchLabels)})
	if err != nil {
		t.Fatal(err)
	}
	var ready []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && podReady(p) {
			ready = append(ready, p)
		}
	}
	return ready
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// leaderPod is the ready replica's pod that holds the leader-election
// Lease, once one does (after a rollout, the Lease may still name a pod
// that is gone until it expires).
func leaderPod(t *testing.T, ctx context.Context) string {
	t.Helper()
	var name string
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cl.Clientset.CoordinationV1().Leases(releaseNS).Get(ctx, "watchgate.watchgate.io", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		// controller-runtime's identity is the hostname (the pod's
		// name), "_" and a UUID.
		name, _, _ = strings.Cut(ptr.Deref(l.Spec.HolderIdentity, ""), "_")
		for _, p := range replicaPods(t, ctx) {
			if p.Name == name {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no ready replica leads (the Lease names %q): %v", name, err)
	}
	return name
}

// waitReplicasReady waits until two replicas other than gone are ready and
// one of them leads.
func waitReplicasReady(t *testing.T, ctx context.Context, gone string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods := replicaPods(t, ctx)
		if len(pods) != 2 {
			return false, nil
		}
		for _, p := range pods {
			if p.Name == gone {
				return false, nil
			}
		}
		l, err := cl.Clientset.CoordinationV1().Leases(releaseNS).Get(ctx, "watchgate.watchgate.io", metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // the new leader has not written the Lease yet: poll again
		}
		holder, _, _ := strings.Cut(ptr.Deref(l.Spec.HolderIdentity, ""), "_")
		return holder != "" && holder != gone, nil
	}); err != nil {
		t.Fatalf("two ready replicas and a new leader after deleting %s: %v", gone, err)
	}
}
