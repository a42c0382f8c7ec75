package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"

	topv1alpha1 "github.com/watchgate/watchgate/api/top/v1alpha1"
)

// The CA publisher's ConfigMap and key (package inject's ConfigMapName
// and ConfigMapKey).
const (
	caConfigMap = "watchgate-root-ca.crt"
	caKey       = "ca.crt"
)

// readTimeout bounds one replica's port-forward and answer; maxReportBytes
// its answer (a replica lists at most MaxLimit identities per budget).
const (
	readTimeout    = 30 * time.Second
	maxReportBytes = 8 << 20
)

// cluster is the API server the kubeconfig names, reached with its
// credentials.
type cluster struct {
	cfg *rest.Config
	cs  kubernetes.Interface
}

func newCluster(cfg *rest.Config) (*cluster, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "kubectl-watchgate/" + version
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &cluster{cfg: cfg, cs: cs}, nil
}

// replica is one watchgate replica: a pod to port-forward to, or a URL.
type replica struct {
	name           string
	url            string // set: reached directly
	namespace, pod string // set: port-forwarded to port
	port           int
}

// errNoToken: the replicas authenticate bearer tokens only.
var errNoToken = errors.New("the kubeconfig's user has no bearer token (token, tokenFile, exec or auth-provider): " +
	"watchgate's replicas authenticate callers by token and a client certificate cannot be forwarded to them; " +
	"use a context with a token, or pass one with --token")

// replicaClient is an HTTPS client for the replicas: it trusts ca only,
// verifies their certificate for serverName, and sends the kubeconfig
// user's bearer credentials (a token, a token file, an exec plugin's or
// an auth provider's, through client-go's transport) and nothing else of
// them.
func (c *cluster) replicaClient(ca []byte, serverName string) (*http.Client, error) {
	if c.cfg.BearerToken == "" && c.cfg.BearerTokenFile == "" && c.cfg.ExecProvider == nil && c.cfg.AuthProvider == nil {
		return nil, errNoToken
	}
	rc := &rest.Config{
		Host:                "https://" + serverName,
		BearerToken:         c.cfg.BearerToken,
		BearerTokenFile:     c.cfg.BearerTokenFile,
		ExecProvider:        c.cfg.ExecProvider,
		AuthProvider:        c.cfg.AuthProvider,
		AuthConfigPersister: c.cfg.AuthConfigPersister,
		TLSClientConfig:     rest.TLSClientConfig{CAData: ca, ServerName: serverName},
		UserAgent:           c.cfg.UserAgent,
		Timeout:             readTimeout,
	}
	return rest.HTTPClientFor(rc)
}

// caBundle is the CA to verify replicas with: --ca-file, else the CA
// publisher's ConfigMap in --ca-namespace.
func (c *cluster) caBundle(ctx context.Context, o *topOptions) ([]byte, error) {
	if o.caFile != "" {
		b, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		return b, nil
	}
	cm, err := c.cs.CoreV1().ConfigMaps(o.caNamespace).Get(ctx, caConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("no ConfigMap %s in namespace %s to verify the replicas with: the CA publisher (injection on) writes it into "+
			"watchgate's namespace and namespaces labelled watchgate.io/inject=enabled; without injection give the CA with --ca-file", caConfigMap, o.caNamespace)
	case err != nil:
		return nil, fmt.Errorf("read ConfigMap %s/%s: %w", o.caNamespace, caConfigMap, err)
	}
	ca := []byte(cm.Data[caKey])
	if _, err := cert.ParseCertsPEM(ca); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: %s holds no CA certificate: %w", o.caNamespace, caConfigMap, caKey, err)
	}
	return ca, nil
}

// replicas are the running pods the proxy Service selects, each with the
// container port its https port targets.
func (c *cluster) replicas(ctx context.Context, namespace, service string) ([]replica, error) {
	svc, err := c.cs.CoreV1().Services(namespace).Get(ctx, service, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("find watchgate's Service: %w (name it with --service, its namespace with -n)", err)
	}
	if len(svc.Spec.Selector) == 0 || len(svc.Spec.Ports) == 0 {
		return nil, fmt.Errorf("the Service %s/%s selects no pods or has no port", namespace, service)
	}
	target := svc.Spec.Ports[0].TargetPort
	for _, p := range svc.Spec.Ports {
		if p.Name == "https" {
			target = p.TargetPort
		}
	}
	pods, err := c.cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(svc.Spec.Selector).String()})
	if err != nil {
		return nil, fmt.Errorf("list watchgate's pods: %w", err)
	}
	var out []replica
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		if port := containerPort(p, target); port > 0 {
			out = append(out, replica{name: p.Name, namespace: namespace, pod: p.Name, port: port})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no running pod of Service %s/%s (selector %s)", namespace, service, labels.SelectorFromSet(svc.Spec.Selector))
	}
	return out, nil
}

// containerPort is the port target names in pod: a number, or a
// container port's name; 0 when the pod has no such port.
func containerPort(pod *corev1.Pod, target intstr.IntOrString) int {
	if target.Type == intstr.Int {
		return target.IntValue()
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == target.StrVal {
				return int(p.ContainerPort)
			}
		}
	}
	return 0
}

// read asks one replica for its report at query, port-forwarding first
// when r is a pod.
func (c *cluster) read(ctx context.Context, client *http.Client, r replica, query string) (*topv1alpha1.TopReport, error) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	base := r.url
	if r.pod != "" {
		fw, err := c.forward(ctx, r.namespace, r.pod, r.port)
		if err != nil {
			return nil, err
		}
		defer fw.stop()
		base = "https://127.0.0.1:" + strconv.Itoa(int(fw.local))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+query, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReportBytes+1))
	switch {
	case err != nil:
		return nil, err
	case len(body) > maxReportBytes:
		return nil, fmt.Errorf("answer larger than %d bytes", maxReportBytes)
	case resp.StatusCode != http.StatusOK:
		var st metav1.Status
		if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
			return nil, fmt.Errorf("%s (HTTP %d)", st.Message, resp.StatusCode)
		}
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	var rep topv1alpha1.TopReport
	if err := json.Unmarshal(body, &rep); err != nil || rep.Kind != topv1alpha1.Kind {
		return nil, fmt.Errorf("not a %s: %.200q", topv1alpha1.Kind, body)
	}
	return &rep, nil
}
