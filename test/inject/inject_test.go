package inject

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/inject"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

func createPod(t *testing.T, ns string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	pod.Namespace = ns
	got, err := env.Clientset.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return got
}

func simplePod(name, sa string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			Containers:         []corev1.Container{{Name: "app", Image: "example.invalid/app:1"}},
		},
	}
}

func env2map(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

// assertRouted checks what the webhook promised for a routed pod.
func assertRouted(t *testing.T, pod *corev1.Pod, target inject.Target) {
	t.Helper()
	if s := pod.Annotations[inject.AnnotationStatus]; s != inject.StatusInjected {
		t.Fatalf("pod %s: status %q (reason %q), want injected", pod.Name, s, pod.Annotations[inject.AnnotationReason])
	}
	var vol *corev1.Volume
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if strings.HasPrefix(v.Name, "kube-api-access-") {
			t.Errorf("pod %s still has the API server's volume %s", pod.Name, v.Name)
		}
		if v.Name == inject.VolumeName {
			vol = v
		}
	}
	if vol == nil || vol.Projected == nil {
		t.Fatalf("pod %s: no projected volume %s: %+v", pod.Name, inject.VolumeName, pod.Spec.Volumes)
	}
	var token, ca, nsFile bool
	for _, s := range vol.Projected.Sources {
		switch {
		case s.ServiceAccountToken != nil:
			token = s.ServiceAccountToken.Path == "token" && ptr.Deref(s.ServiceAccountToken.ExpirationSeconds, 0) == 3607
		case s.ConfigMap != nil:
			ca = s.ConfigMap.Name == inject.ConfigMapName && len(s.ConfigMap.Items) == 1 && s.ConfigMap.Items[0].Key == "ca.crt" && s.ConfigMap.Items[0].Path == "ca.crt"
		case s.DownwardAPI != nil:
			nsFile = len(s.DownwardAPI.Items) == 1 && s.DownwardAPI.Items[0].Path == "namespace" && s.DownwardAPI.Items[0].FieldRef.FieldPath == "metadata.namespace"
		}
	}
	if !token || !ca || !nsFile {
		t.Errorf("pod %s: projected sources token=%v ca=%v namespace=%v: %+v", pod.Name, token, ca, nsFile, vol.Projected.Sources)
	}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		e := env2map(c)
		if e["KUBERNETES_SERVICE_HOST"] != target.Host || e["KUBERNETES_SERVICE_PORT"] != itoa(target.Port) {
			t.Errorf("pod %s container %s: env %v", pod.Name, c.Name, e)
		}
		mounted := false
		for _, m := range c.VolumeMounts {
			if m.MountPath == inject.TokenPath && m.Name == inject.VolumeName && m.ReadOnly {
				mounted = true
			}
		}
		if !mounted {
			t.Errorf("pod %s container %s: %s not mounted read-only at %s: %+v", pod.Name, c.Name, inject.VolumeName, inject.TokenPath, c.VolumeMounts)
		}
	}
}

func itoa(n int32) string { b, _ := json.Marshal(n); return string(b) }

func assertSkipped(t *testing.T, pod *corev1.Pod, reason inject.SkipReason) {
	t.Helper()
	if s, r := pod.Annotations[inject.AnnotationStatus], pod.Annotations[inject.AnnotationReason]; s != inject.StatusSkipped || !strings.HasPrefix(r, string(reason)+":") {
		t.Errorf("pod %s: status %q reason %q, want skipped %s", pod.Name, s, r, reason)
	}
	for _, c := range pod.Spec.Containers {
		if _, ok := env2map(c)["KUBERNETES_SERVICE_HOST"]; ok {
			t.Errorf("pod %s: a skipped pod got KUBERNETES_SERVICE_HOST", pod.Name)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == inject.VolumeName {
			t.Errorf("pod %s: a skipped pod got %s", pod.Name, v.Name)
		}
	}
}

func configMapCA(t *testing.T, ns string) string {
	t.Helper()
	cm, err := env.Clientset.CoreV1().ConfigMaps(ns).Get(context.Background(), inject.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return cm.Data[inject.ConfigMapKey]
}

// Pods created through the API server in a labelled namespace come back
// routed; those that opt out, mount their own token, use the host network,
// turn automount off or are routed already are left as they are, with an
// annotation saying why; the CA is published where pods are routed, and
// rewritten when the CA file changes.
func TestPodsInALabelledNamespaceAreRouted(t *testing.T) {
	p := startProxy(t)
	caFile := filepath.Join(p.Dir, "ca.crt")
	startInjector(t, p.Target, caFile)
	ns := uniqueName("routed")
	namespace(t, ns, map[string]string{inject.LabelInject: inject.ValueEnabled}, "agent")

	routed := createPod(t, ns, simplePod("plain", "agent"))
	assertRouted(t, routed, p.Target)

	optOut := simplePod("opt-out", "agent")
	optOut.Labels = map[string]string{inject.LabelInject: inject.ValueDisabled}
	assertSkipped(t, createPod(t, ns, optOut), inject.SkipOptedOut)

	hostNet := simplePod("host-network", "agent")
	hostNet.Spec.HostNetwork = true
	assertSkipped(t, createPod(t, ns, hostNet), inject.SkipHostNetwork)

	noMount := simplePod("no-automount", "agent")
	noMount.Spec.AutomountServiceAccountToken = ptr.To(false)
	assertSkipped(t, createPod(t, ns, noMount), inject.SkipAutomountDisabled)

	ownToken := simplePod("own-token", "agent")
	ownToken.Spec.Volumes = []corev1.Volume{{Name: "my-token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "my-token"}}}}
	ownToken.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "my-token", MountPath: inject.TokenPath, ReadOnly: true}}
	assertSkipped(t, createPod(t, ns, ownToken), inject.SkipOwnToken)

	// A pod whose spec is already routed (e.g. copied from a routed one)
	// comes back exactly as sent.
	again := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "already", Annotations: routed.Annotations}, Spec: *routed.Spec.DeepCopy()}
	again.Spec.NodeName = ""
	got := createPod(t, ns, again)
	assertRouted(t, got, p.Target)
	if !equality.Semantic.DeepEqual(got.Spec.Volumes, routed.Spec.Volumes) || !equality.Semantic.DeepEqual(got.Spec.Containers, routed.Spec.Containers) {
		t.Errorf("re-admitting a routed pod changed it:\n%+v\n%+v", got.Spec, routed.Spec)
	}

	// A pod label alone routes in an unlabelled namespace; an unlabelled
	// pod there is not even annotated.
	other := uniqueName("unlabelled")
	namespace(t, other, nil, "agent")
	byLabel := simplePod("by-label", "agent")
	byLabel.Labels = map[string]string{inject.LabelInject: inject.ValueEnabled}
	assertRouted(t, createPod(t, other, byLabel), p.Target)
	if plain := createPod(t, other, simplePod("plain", "agent")); len(plain.Annotations) != 0 || len(plain.Spec.Containers[0].Env) != 0 {
		t.Errorf("unlabelled pod was touched: %v %v", plain.Annotations, plain.Spec.Containers[0].Env)
	}

	// watchgate's own namespace is never routed, whatever its label says.
	namespace(t, ownNamespace, map[string]string{inject.LabelInject: inject.ValueEnabled}, "agent")
	own := createPod(t, ownNamespace, simplePod(uniqueName("own"), "agent"))
	if len(own.Annotations) != 0 || len(own.Spec.Containers[0].Env) != 0 {
		t.Errorf("pod in %s was touched: %v", ownNamespace, own.Annotations)
	}

	// The CA is published in both namespaces with routed pods, never in
	// watchgate's own, and follows the CA file.
	for _, n := range []string{ns, other} {
		eventually(t, 30*time.Second, "CA published in "+n, func() (bool, error) { return configMapCA(t, n) == string(p.CA), nil })
	}
	rotated := newPKI(t).caPEM
	if err := os.WriteFile(caFile, rotated, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{ns, other} {
		eventually(t, 30*time.Second, "rotated CA published in "+n, func() (bool, error) { return configMapCA(t, n) == string(rotated), nil })
	}
	if configMapCA(t, ownNamespace) != "" {
		t.Errorf("CA published in %s", ownNamespace)
	}
}

// rancherAgent is the pod template of Rancher's cattle-cluster-agent
// Deployment, written from rancher/rancher pkg/systemtemplate/template.go:
// an init container that copies charts, the cluster-register container
// with its CATTLE_* environment and its volumes, service account cattle.
func rancherAgent() *appsv1.Deployment {
	labels := map[string]string{"app": "cattle-cluster-agent"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "cattle-cluster-agent", Annotations: map[string]string{"management.cattle.io/scale-available": "2"}},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: "cattle",
					Tolerations: []corev1.Toleration{
						{Effect: corev1.TaintEffectNoSchedule, Key: "node-role.kubernetes.io/controlplane", Value: "true"},
						{Effect: corev1.TaintEffectNoSchedule, Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists},
					},
					InitContainers: []corev1.Container{{
						Name: "rancher-charts-copy", Image: "rancher/rancher-agent:v2.11.0", ImagePullPolicy: corev1.PullIfNotPresent,
						VolumeMounts: []corev1.VolumeMount{{Name: "rancher-charts", MountPath: "/charts"}},
					}},
					Containers: []corev1.Container{{
						Name: "cluster-register", Image: "rancher/rancher-agent:v2.11.0", ImagePullPolicy: corev1.PullIfNotPresent,
						Env: []corev1.EnvVar{
							{Name: "CATTLE_SERVER", Value: "https://rancher.example.com"},
							{Name: "CATTLE_CA_CHECKSUM", Value: "0123456789abcdef"},
							{Name: "CATTLE_CLUSTER", Value: "true"},
							{Name: "CATTLE_K8S_MANAGED", Value: "true"},
							{Name: "CATTLE_SYSTEM_DEFAULT_REGISTRY", Value: ""},
							{Name: "CATTLE_CREDENTIAL_NAME", Value: "cattle-credentials-abc123"},
							{Name: "CATTLE_SUC_APP_NAME_OVERRIDE", Value: ""},
						},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "rancher-charts", MountPath: "/var/lib/rancher-data/local-catalogs/v2"},
							{Name: "cattle-credentials", MountPath: "/cattle-credentials", ReadOnly: true},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "rancher-charts", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: "cattle-credentials", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "cattle-credentials-abc123", DefaultMode: ptr.To[int32](320)}}},
					},
				},
			},
		},
	}
}

// inClusterConfig is what rest.InClusterConfig returns inside the pod: the
// host from the container's KUBERNETES_SERVICE_HOST/PORT, the token and CA
// from the files of the projected volume, materialised in dir as the
// kubelet would (a TokenRequest bound to the pod with the volume's expiry,
// the ConfigMap's ca.crt, the namespace).
func inClusterConfig(t *testing.T, pod *corev1.Pod, container, dir string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	var c *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == container {
			c = &pod.Spec.Containers[i]
		}
	}
	var vol *corev1.Volume
	for _, m := range c.VolumeMounts {
		if m.MountPath == inject.TokenPath {
			for i := range pod.Spec.Volumes {
				if pod.Spec.Volumes[i].Name == m.Name {
					vol = &pod.Spec.Volumes[i]
				}
			}
		}
	}
	if vol == nil || vol.Projected == nil {
		t.Fatalf("container %s mounts no projected volume at %s", container, inject.TokenPath)
	}
	for _, s := range vol.Projected.Sources {
		switch {
		case s.ServiceAccountToken != nil:
			tr, err := env.Clientset.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
				Spec: authenticationv1.TokenRequestSpec{
					Audiences:         nil,
					ExpirationSeconds: s.ServiceAccountToken.ExpirationSeconds,
					BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, s.ServiceAccountToken.Path), tr.Status.Token)
		case s.ConfigMap != nil:
			var cm *corev1.ConfigMap
			eventually(t, 30*time.Second, "ConfigMap "+s.ConfigMap.Name, func() (bool, error) {
				var err error
				cm, err = env.Clientset.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, s.ConfigMap.Name, metav1.GetOptions{})
				return err == nil, err
			})
			for _, item := range s.ConfigMap.Items {
				write(t, filepath.Join(dir, item.Path), cm.Data[item.Key])
			}
		case s.DownwardAPI != nil:
			write(t, filepath.Join(dir, "namespace"), pod.Namespace)
		}
	}
	e := env2map(*c)
	host, port := e["KUBERNETES_SERVICE_HOST"], e["KUBERNETES_SERVICE_PORT"]
	if host == "" || port == "" {
		t.Fatalf("container %s has no KUBERNETES_SERVICE_HOST/PORT: %v", container, e)
	}
	// The body of rest.InClusterConfig, with its fixed folder replaced by dir.
	token, err := os.ReadFile(filepath.Join(dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg := rest.TLSClientConfig{}
	if _, err := os.Stat(filepath.Join(dir, "ca.crt")); err == nil {
		tlsCfg.CAFile = filepath.Join(dir, "ca.crt")
	}
	return &rest.Config{
		Host:            "https://" + net.JoinHostPort(host, port),
		TLSClientConfig: tlsCfg,
		BearerToken:     string(token),
		BearerTokenFile: filepath.Join(dir, "token"),
	}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Rancher's cluster agent, in a namespace labelled for injection, is routed;
// the client it would run lists and watches through watchgate, trusting
// watchgate's CA from the ConfigMap, and its watches are charged to its
// own identity.
func TestRancherClusterAgentTalksThroughWatchgate(t *testing.T) {
	ns := uniqueName("cattle-system")
	agent := ratelimit.Subject{Kind: ratelimit.ServiceAccount, Namespace: ns, Name: "cattle"}
	others := generous("everyone-else")
	others.Precedence = 1000
	p := startProxy(t, generous("cattle-agent", agent), others)
	startInjector(t, p.Target, filepath.Join(p.Dir, "ca.crt"))
	namespace(t, ns, map[string]string{inject.LabelInject: inject.ValueEnabled}, "cattle")
	sa := apiserver.ServiceAccount{Namespace: ns, Name: "cattle"}
	if err := env.Grant(context.Background(), sa, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	d := rancherAgent()
	if _, err := env.Clientset.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller-manager runs here: create the pod the ReplicaSet would.
	tmpl := d.Spec.Template
	pod := createPod(t, ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cattle-cluster-agent-7d9f8-abcde", Labels: tmpl.Labels}, Spec: tmpl.Spec})
	assertRouted(t, pod, p.Target)
	register := pod.Spec.Containers[0]
	if e := env2map(register); e["CATTLE_SERVER"] != "https://rancher.example.com" || e["CATTLE_CREDENTIAL_NAME"] != "cattle-credentials-abc123" {
		t.Errorf("cluster-register lost its own env: %v", e)
	}
	if len(register.VolumeMounts) != 3 || len(pod.Spec.Volumes) != 3 {
		t.Errorf("volumes: %+v mounts: %+v", pod.Spec.Volumes, register.VolumeMounts)
	}

	cfg := inClusterConfig(t, pod, "cluster-register", t.TempDir())
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	list, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list through watchgate: %v", err)
	}
	if len(list.Items) == 0 {
		t.Errorf("list through watchgate found no ConfigMap (watchgate-root-ca.crt is there)")
	}
	w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatalf("watch through watchgate: %v", err)
	}
	defer w.Stop()
	eventually(t, 10*time.Second, "the watch charged to the agent", func() (bool, error) {
		return p.Engine.Stats()["cattle-agent"].ActiveWatches == 1, nil
	})
	if s := p.Engine.Stats(); s["cattle-agent"].TrackedIdentities != 1 || s["everyone-else"].ActiveWatches != 0 {
		t.Errorf("stats: %+v", s)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hello"}}
	if _, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Added || ev.Object.(*corev1.ConfigMap).Name != "hello" {
			t.Errorf("event %v %T", ev.Type, ev.Object)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no event through watchgate within 30s")
	}
}

// With the webhook down (no server behind its address), pods are created
// all the same, unrouted: failurePolicy Ignore.
func TestPodsAreCreatedWhenTheWebhookIsDown(t *testing.T) {
	ns := uniqueName("down")
	namespace(t, ns, map[string]string{inject.LabelInject: inject.ValueEnabled}, "agent")
	pod := createPod(t, ns, simplePod("while-down", "agent"))
	if len(pod.Annotations) != 0 || len(pod.Spec.Containers[0].Env) != 0 {
		t.Errorf("pod was mutated with no webhook running: %v", pod.Annotations)
	}
	found := false
	for _, v := range pod.Spec.Volumes {
		found = found || strings.HasPrefix(v.Name, "kube-api-access-")
	}
	if !found {
		t.Errorf("pod has no kube-api-access volume: it talks to the API server directly as before")
	}
}
