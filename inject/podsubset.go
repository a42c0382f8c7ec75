package inject

import (
	"bytes"
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

// maxContainers bounds the containers and init containers of a pod the
// injector routes: routing works on corev1.Containers, several hundred
// bytes each, which a flood of `{"name":"c"}` would multiply.
const maxContainers = 256

var errTooManyContainers = errors.New("more than 256 containers")

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
	Env          envList              `json:"env,omitempty"`
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`
}

// envList is a container's environment as routing needs it: how many
// variables there are, and the KUBERNETES_SERVICE_* ones (routing appends
// its own and leaves a pod that sets them alone). The others are counted,
// not stored: a pointer each while decoding.
type envList struct {
	n    int
	ours []corev1.EnvVar
}

// envEntry decodes one variable only when it may be one of routing's.
type envEntry struct{ v *corev1.EnvVar }

func (e *envEntry) UnmarshalJSON(data []byte) error {
	// An escaped name (\u...) is decoded to be read as the API server
	// reads it.
	if !bytes.Contains(data, []byte("KUBERNETES_SERVICE_")) && !bytes.Contains(data, []byte(`\u`)) {
		return nil
	}
	e.v = &corev1.EnvVar{}
	return json.Unmarshal(data, e.v)
}

func (l *envList) UnmarshalJSON(data []byte) error {
	var entries []envEntry
	if err := json.Unmarshal(data, &entries); err != nil {
		return err
	}
	l.n = len(entries)
	for _, e := range entries {
		if e.v != nil {
			l.ours = append(l.ours, *e.v)
		}
	}
	return nil
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
	if len(s.Spec.InitContainers)+len(s.Spec.Containers) > maxContainers {
		return nil, errTooManyContainers
	}
	convert := func(cs []containerSubset) []corev1.Container {
		out := make([]corev1.Container, len(cs))
		for i, c := range cs {
			out[i] = corev1.Container{Name: c.Name, Env: c.Env.ours, VolumeMounts: c.VolumeMounts}
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
	// per container (init containers first): the variables the pod has
	// (all of them, not only those the corev1.Pod holds), the variables
	// the corev1.Pod holds, mount names
	envTotal []int
	envLen   []int
	mounts   [][]string
}

// snapshotOf records pod before routing; envTotal is each container's
// number of variables in the review (init containers first), when pod
// holds only some of them (podSubset.pod).
func snapshotOf(pod *corev1.Pod, envTotal []int) snapshot {
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
	for k, c := range allContainers(&pod.Spec) {
		total := len(c.Env)
		if envTotal != nil {
			total = envTotal[k]
		}
		s.envTotal = append(s.envTotal, total)
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

// envTotals is each container's number of variables in the review, init
// containers first.
func (s *podSubset) envTotals() []int {
	var out []int
	for _, c := range s.Spec.InitContainers {
		out = append(out, c.Env.n)
	}
	for _, c := range s.Spec.Containers {
		out = append(out, c.Env.n)
	}
	return out
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
		case s.envTotal[k] == 0 && len(c.Env) > 0:
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
