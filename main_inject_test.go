package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/cert"

	"github.com/watchgate/watchgate/inject"
)

// With --webhook-port, run serves the injection webhook with the serving
// certificate and publishes ca.crt beside --tls-cert-file (the Secret's
// layout) into labelled namespaces; with --mode=injector it does that and
// nothing else (no proxy), and is ready once the webhook serves.
func TestRunWithInjectionServesTheWebhookAndPublishesTheCA(t *testing.T) {
	for _, mode := range []string{"all", "injector"} {
		t.Run(mode, func(t *testing.T) { runWithInjection(t, mode) })
	}
}

func runWithInjection(t *testing.T, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("localhost", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": certPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ns := "main-inject-routed-" + mode
	if _, err := env.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{inject.LabelInject: inject.ValueEnabled}}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	webhookAddr, proxyAddr, probeAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	_, webhookPort, _ := net.SplitHostPort(webhookAddr)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{
			"--mode", mode,
			"--kubeconfig", env.Kubeconfig,
			"--proxy-bind-address", proxyAddr,
			"--metrics-bind-address", "0",
			"--health-probe-bind-address", probeAddr,
			"--tls-cert-file", filepath.Join(dir, "tls.crt"),
			"--tls-private-key-file", filepath.Join(dir, "tls.key"),
			"--webhook-port", webhookPort,
			"--pod-name", "main-inject-" + mode,
			"--pod-namespace", "main-inject-own",
			"--shutdown-grace-period", "1s",
		})
	}()
	defer func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run after cancel = %v", err)
			}
		case <-time.After(45 * time.Second):
			t.Error("run did not return within 45s of cancel")
		}
	}()

	deadline := time.Now().Add(60 * time.Second)
	for {
		cm, err := env.Clientset.CoreV1().ConfigMaps(ns).Get(ctx, inject.ConfigMapName, metav1.GetOptions{})
		if err == nil && cm.Data[inject.ConfigMapKey] == string(certPEM) {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("ConfigMap %s/%s with the CA not published within 60s: %v", ns, inject.ConfigMapName, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}}
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: "kube-api-access-abcde", MountPath: inject.TokenPath}}}},
			Volumes: []corev1.Volume{{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}},
			}}}}},
		},
	}
	raw, _ := json.Marshal(pod)
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: ns, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
		},
	}
	body, _ := json.Marshal(review)
	resp, err := c.Post("https://"+webhookAddr+inject.WebhookPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("webhook: %v", err)
	}
	defer resp.Body.Close()
	var answer admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Fatal(err)
	}
	if answer.Response == nil || !answer.Response.Allowed || !strings.Contains(string(answer.Response.Patch), "watchgate.main-inject-own.svc.cluster.local") {
		t.Errorf("webhook answer = %+v (patch %s), want allowed with a patch naming watchgate.main-inject-own.svc.cluster.local", answer.Response, answer.Response.Patch)
	}

	// Ready once the webhook serves (and, in mode all, the budgets are
	// loaded and the upstream answered), which may come after the CA.
	readyBy := time.Now().Add(30 * time.Second)
	for {
		code, body := 0, ""
		ready, err := http.Get("http://" + probeAddr + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(ready.Body)
			ready.Body.Close()
			code, body = ready.StatusCode, string(b)
		}
		if code == http.StatusOK {
			break
		}
		if time.Now().After(readyBy) {
			t.Fatalf("/readyz = %d %q (%v) 30s after the webhook answered, want 200", code, body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if c, err := net.DialTimeout("tcp", proxyAddr, 5*time.Second); (err == nil) != (mode == "all") {
		t.Errorf("--mode=%s: proxy address %s dialled with error %v; the proxy runs only in mode all", mode, proxyAddr, err)
	} else if err == nil {
		c.Close()
	}
}
