package inject

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

var target = Target{Host: "watchgate.watchgate-system.svc", Port: 443}

// admitted is a pod as the API server's ServiceAccount admission plugin
// leaves it: a kube-api-access volume mounted in every container.
func admitted() *corev1.Pod {
	mount := corev1.VolumeMount{Name: "kube-api-access-x7k2p", MountPath: TokenPath, ReadOnly: true}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "cattle-system"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "init", VolumeMounts: []corev1.VolumeMount{mount}}},
			Containers: []corev1.Container{{
				Name:         "cluster-register",
				Env:          []corev1.EnvVar{{Name: "CATTLE_CLUSTER", Value: "true"}},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, mount},
			}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
					DefaultMode: ptr.To[int32](420),
					Sources: []corev1.VolumeProjection{
						{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{ExpirationSeconds: ptr.To[int64](3607), Path: "token"}},
						{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
						{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
					},
				}}},
			},
		},
	}
}

func TestRouteRewritesEveryContainerAndTheTokenVolume(t *testing.T) {
	pod := admitted()
	if reason, msg := Route(pod, target); reason != "" {
		t.Fatalf("skipped: %s %s", reason, msg)
	}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		if env[envHost] != target.Host || env[envPort] != "443" {
			t.Errorf("container %s env = %v", c.Name, env)
		}
		found := false
		for _, m := range c.VolumeMounts {
			if m.MountPath == TokenPath {
				found = m.Name == VolumeName && m.ReadOnly
			}
		}
		if !found {
			t.Errorf("container %s does not mount %s read-only at %s: %v", c.Name, VolumeName, TokenPath, c.VolumeMounts)
		}
	}
	v := pod.Spec.Volumes[1]
	if v.Name != VolumeName || v.Projected == nil || len(v.Projected.Sources) != 3 {
		t.Fatalf("volume = %+v", v)
	}
	if s := v.Projected.Sources[0].ServiceAccountToken; s == nil || *s.ExpirationSeconds != 3607 || s.Path != "token" {
		t.Errorf("token source = %+v", s)
	}
	if s := v.Projected.Sources[1].ConfigMap; s == nil || s.Name != ConfigMapName || s.Items[0].Key != ConfigMapKey || s.Items[0].Path != "ca.crt" {
		t.Errorf("CA source = %+v", s)
	}
	if s := v.Projected.Sources[2].DownwardAPI; s == nil || s.Items[0].Path != "namespace" {
		t.Errorf("namespace source = %+v", s)
	}
	var rec Record
	if err := json.Unmarshal([]byte(pod.Annotations[AnnotationInjected]), &rec); err != nil {
		t.Fatal(err)
	}
	if pod.Annotations[AnnotationStatus] != StatusInjected || rec != (Record{APIServer: "watchgate.watchgate-system.svc:443", Volume: VolumeName, Replaced: "kube-api-access-x7k2p"}) {
		t.Errorf("annotations = %v", pod.Annotations)
	}

	again := pod.DeepCopy()
	if reason, _ := Route(again, target); reason != "" || !equality.Semantic.DeepEqual(pod, again) {
		t.Errorf("routing twice changed the pod (reason %q):\n%+v\n%+v", reason, pod, again)
	}
}

func TestRouteLeavesAlone(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*corev1.Pod)
		want SkipReason
	}{
		"a pod on the host network": {func(p *corev1.Pod) { p.Spec.HostNetwork = true }, SkipHostNetwork},
		"a pod that turns automount off": {func(p *corev1.Pod) {
			p.Spec.AutomountServiceAccountToken = ptr.To(false)
			p.Spec.Volumes = p.Spec.Volumes[:1]
		}, SkipAutomountDisabled},
		"a pod that mounts its own token": {func(p *corev1.Pod) {
			p.Spec.Volumes = p.Spec.Volumes[:1]
			c := &p.Spec.Containers[0]
			c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: TokenPath}}
			p.Spec.InitContainers = nil
		}, SkipOwnToken},
		"a pod with no token volume": {func(p *corev1.Pod) {
			p.Spec.Volumes = p.Spec.Volumes[:1]
			p.Spec.InitContainers = nil
			p.Spec.Containers[0].VolumeMounts = p.Spec.Containers[0].VolumeMounts[:1]
		}, SkipNoServiceAccountToken},
		"a container that names its own API server": {func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: envHost, Value: "10.0.0.1"})
		}, SkipOwnAPIServer},
	} {
		t.Run(name, func(t *testing.T) {
			pod := admitted()
			tc.edit(pod)
			before := pod.Spec.DeepCopy()
			reason, _ := Route(pod, target)
			if reason != tc.want {
				t.Fatalf("reason = %q, want %q", reason, tc.want)
			}
			if !equality.Semantic.DeepEqual(before, &pod.Spec) {
				t.Errorf("spec changed")
			}
			if pod.Annotations[AnnotationStatus] != StatusSkipped || reasonOf(pod.Annotations[AnnotationReason]) != string(tc.want) {
				t.Errorf("annotations = %v", pod.Annotations)
			}
		})
	}
}

func TestWanted(t *testing.T) {
	for name, tc := range map[string]struct {
		pod, ns          string
		wanted, optedOut bool
	}{
		"namespace label routes":             {"", "enabled", true, false},
		"pod label routes without namespace": {"enabled", "", true, false},
		"pod label wins over namespace":      {"enabled", "disabled", true, false},
		"disabled opts a pod out":            {"disabled", "enabled", false, true},
		"no label, no routing":               {"", "", false, false},
		"other values are not enabled":       {"", "true", false, false},
	} {
		t.Run(name, func(t *testing.T) {
			lbl := func(v string) map[string]string {
				if v == "" {
					return nil
				}
				return map[string]string{LabelInject: v}
			}
			w, o := Wanted(lbl(tc.pod), lbl(tc.ns))
			if w != tc.wanted || o != tc.optedOut {
				t.Errorf("Wanted = %v, %v; want %v, %v", w, o, tc.wanted, tc.optedOut)
			}
		})
	}
}
