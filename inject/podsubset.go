package inject

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxMetadataMapBytes bounds the JSON of a pod's labels or annotations the
// injector decodes: the API server's own limit for a pod's annotations
// (256 KiB). A map of many tiny entries takes several times its JSON size
// in memory; a bigger one is not decoded and the pod is admitted unrouted.
const maxMetadataMapBytes = 256 << 10

var errMetadataTooLarge = errors.New("labels or annotations over 256 KiB")

// podSubset is the part of a Pod that routing reads and writes: the
// decoder skips every other field of the review without storing it, so an
// admission holds the body and little more, never a full corev1.Pod and
// its copies.
type podSubset struct {
	Metadata struct {
		Name         string     `json:"name,omitempty"`
		GenerateName string     `json:"generateName,omitempty"`
		Namespace    string     `json:"namespace,omitempty"`
		Labels       boundedMap `json:"labels,omitempty"`
		Annotations  boundedMap `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec struct {
		HostNetwork                  bool              `json:"hostNetwork,omitempty"`
		AutomountServiceAccountToken *bool             `json:"automountServiceAccountToken,omitempty"`
		InitContainers               []containerSubset `json:"initContainers,omitempty"`
		Containers                   []containerSubset `json:"containers,omitempty"`
		Volumes                      []volumeSubset    `json:"volumes,omitempty"`
	} `json:"spec"`
}

type containerSubset struct {
	Name         string               `json:"name"`
	Env          []corev1.EnvVar      `json:"env,omitempty"`
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`
}

// volumeSubset is a volume's name and, for a projected volume (the
// service-account volume routing replaces), its sources; other volumes'
// sources are skipped.
type volumeSubset struct {
	Name      string                        `json:"name"`
	Projected *corev1.ProjectedVolumeSource `json:"projected,omitempty"`
}

// boundedMap is a map[string]string decoded only when its JSON is at most
// maxMetadataMapBytes; a larger one is left nil and marked tooLarge.
type boundedMap struct {
	m        map[string]string
	tooLarge bool
}

func (b *boundedMap) UnmarshalJSON(data []byte) error {
	if len(data) > maxMetadataMapBytes {
		b.m, b.tooLarge = nil, true
		return nil
	}
	return json.Unmarshal(data, &b.m)
}

func (b boundedMap) MarshalJSON() ([]byte, error) { return json.Marshal(b.m) }

// pod is the subset as a corev1.Pod holding only those fields, for Route.
// The slices are shared with s.
func (s *podSubset) pod() (*corev1.Pod, error) {
	if s.Metadata.Labels.tooLarge || s.Metadata.Annotations.tooLarge {
		return nil, errMetadataTooLarge
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: s.Metadata.Name, GenerateName: s.Metadata.GenerateName, Namespace: s.Metadata.Namespace,
		Labels: s.Metadata.Labels.m, Annotations: s.Metadata.Annotations.m,
	}}
	spec := &pod.Spec
	spec.HostNetwork = s.Spec.HostNetwork
	spec.AutomountServiceAccountToken = s.Spec.AutomountServiceAccountToken
	convert := func(cs []containerSubset) []corev1.Container {
		out := make([]corev1.Container, len(cs))
		for i, c := range cs {
			out[i] = corev1.Container{Name: c.Name, Env: c.Env, VolumeMounts: c.VolumeMounts}
		}
		return out
	}
	spec.InitContainers = convert(s.Spec.InitContainers)
	spec.Containers = convert(s.Spec.Containers)
	spec.Volumes = make([]corev1.Volume, len(s.Spec.Volumes))
	for i, v := range s.Spec.Volumes {
		spec.Volumes[i] = corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{Projected: v.Projected}}
	}
	return pod, nil
}

// snapshot is what routing may change in a pod, taken before it does, so
// that the JSON patch is written from the difference alone.
type snapshot struct {
	annotations map[string]string
	hadMap      bool
	volumes     []string
	// per container (init containers first): env length, mount names
	envLen []int
	mounts [][]string
}

func snapshotOf(pod *corev1.Pod) snapshot {
	s := snapshot{hadMap: pod.Annotations != nil, annotations: make(map[string]string, 3)}
	// Routing writes or removes only its own annotations.
	for _, k := range []string{AnnotationStatus, AnnotationReason, AnnotationInjected} {
		if v, ok := pod.Annotations[k]; ok {
			s.annotations[k] = v
		}
	}
	for _, v := range pod.Spec.Volumes {
		s.volumes = append(s.volumes, v.Name)
	}
	for _, c := range allContainers(&pod.Spec) {
		s.envLen = append(s.envLen, len(c.Env))
		names := make([]string, len(c.VolumeMounts))
		for i, m := range c.VolumeMounts {
			names[i] = m.Name
		}
		s.mounts = append(s.mounts, names)
	}
	return s
}

// patchOp is one RFC 6902 operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// patchFrom is the JSON patch that turns the pod before (as s recorded it)
// into pod. Route only appends environment variables (it skips pods that
// set watchgate's own), renames mounts, replaces or removes the
// service-account volume and sets or removes its own annotations; the
// patch says exactly that.
func patchFrom(s snapshot, pod *corev1.Pod) []patchOp {
	var ops []patchOp
	switch {
	case !s.hadMap && len(pod.Annotations) > 0:
		ops = append(ops, patchOp{Op: "add", Path: "/metadata/annotations", Value: pod.Annotations})
	case s.hadMap:
		for _, k := range []string{AnnotationStatus, AnnotationReason, AnnotationInjected} {
			before, had := s.annotations[k]
			after, has := pod.Annotations[k]
			switch {
			case has && (!had || before != after):
				ops = append(ops, patchOp{Op: "add", Path: "/metadata/annotations/" + escape(k), Value: after})
			case had && !has:
				ops = append(ops, patchOp{Op: "remove", Path: "/metadata/annotations/" + escape(k)})
			}
		}
	}

	vols := pod.Spec.Volumes
	if len(vols) == len(s.volumes)-1 {
		i := 0
		for i < len(vols) && vols[i].Name == s.volumes[i] {
			i++
		}
		ops = append(ops, patchOp{Op: "remove", Path: "/spec/volumes/" + strconv.Itoa(i)})
	} else {
		for i := range vols {
			if vols[i].Name != s.volumes[i] {
				ops = append(ops, patchOp{Op: "replace", Path: "/spec/volumes/" + strconv.Itoa(i), Value: vols[i]})
			}
		}
	}

	nInit := len(pod.Spec.InitContainers)
	for k, c := range allContainers(&pod.Spec) {
		base := "/spec/containers/" + strconv.Itoa(k-nInit)
		if k < nInit {
			base = "/spec/initContainers/" + strconv.Itoa(k)
		}
		for j, m := range c.VolumeMounts {
			if m.Name != s.mounts[k][j] {
				ops = append(ops, patchOp{Op: "replace", Path: base + "/volumeMounts/" + strconv.Itoa(j) + "/name", Value: m.Name})
			}
		}
		switch n := s.envLen[k]; {
		case n == 0 && len(c.Env) > 0:
			ops = append(ops, patchOp{Op: "add", Path: base + "/env", Value: c.Env})
		default:
			for _, e := range c.Env[n:] {
				ops = append(ops, patchOp{Op: "add", Path: base + "/env/-", Value: e})
			}
		}
	}
	return ops
}

// escape is a JSON pointer's escaping of one reference token (RFC 6901).
func escape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
