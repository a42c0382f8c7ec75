package inject

import (
	"encoding/json"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The label that asks for routing, on a pod or its namespace, and its values.
const (
	// LabelInject on a pod or namespace: "enabled" routes, "disabled" (on a
	// pod) opts out. The pod's label wins over its namespace's.
	LabelInject = "watchgate.io/inject"
	// ValueEnabled routes the pod (or every pod of the namespace).
	ValueEnabled = "enabled"
	// ValueDisabled opts a pod out of its namespace's routing.
	ValueDisabled = "disabled"
)

// Annotations the webhook writes, so that `kubectl get pod -o yaml` says
// what was done, like Istio's sidecar.istio.io/status.
const (
	// AnnotationStatus is "injected" or "skipped".
	AnnotationStatus = "watchgate.io/inject-status"
	// AnnotationReason is, for a skipped pod, the SkipReason and a sentence.
	AnnotationReason = "watchgate.io/inject-reason"
	// AnnotationInjected is, for a routed pod, a JSON Record.
	AnnotationInjected = "watchgate.io/injected"

	StatusInjected = "injected"
	StatusSkipped  = "skipped"
)

// What a routed pod mounts.
const (
	// ConfigMapName is the ConfigMap the CAPublisher keeps in every routed
	// namespace, like kube-root-ca.crt.
	ConfigMapName = "watchgate-root-ca.crt"
	// ConfigMapKey holds watchgate's CA bundle (PEM).
	ConfigMapKey = "ca.crt"
	// VolumeName is the projected volume that replaces kube-api-access-*.
	VolumeName = "watchgate-api-access"
	// TokenPath is where client-go's rest.InClusterConfig reads token,
	// ca.crt and namespace.
	TokenPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// DefaultTokenExpirationSeconds is the kubelet's default for the
	// projected token (3607 s: an hour and the 7 s kube-apiserver uses to
	// recognise legacy-length tokens), used when the replaced volume names
	// none.
	DefaultTokenExpirationSeconds int64 = 3607

	envHost = "KUBERNETES_SERVICE_HOST"
	envPort = "KUBERNETES_SERVICE_PORT"
	// apiAccessPrefix is the name prefix of the volume the API server's
	// ServiceAccount admission plugin adds.
	apiAccessPrefix = "kube-api-access-"
	rootCAName      = "kube-root-ca.crt"
)

// Target is where routed pods send their API requests: watchgate's Service.
type Target struct {
	// Host is the Service's DNS name (e.g. watchgate.watchgate-system.svc);
	// it must be a name in the serving certificate.
	Host string
	// Port is the Service's port (1-65535).
	Port int32
}

// SkipReason says why a pod that asked for routing was left alone.
type SkipReason string

const (
	// SkipOptedOut: the pod's label is "disabled".
	SkipOptedOut SkipReason = "OptedOut"
	// SkipHostNetwork: the pod uses the node's network and DNS, where the
	// Service's name may not resolve.
	SkipHostNetwork SkipReason = "HostNetwork"
	// SkipAutomountDisabled: automountServiceAccountToken is false.
	SkipAutomountDisabled SkipReason = "AutomountDisabled"
	// SkipNoServiceAccountToken: no kube-api-access-* volume to replace
	// (the service account disables automount, or the ServiceAccount
	// admission plugin is off).
	SkipNoServiceAccountToken SkipReason = "NoServiceAccountToken"
	// SkipOwnToken: a container mounts something else at TokenPath.
	SkipOwnToken SkipReason = "OwnToken"
	// SkipOwnAPIServer: a container sets KUBERNETES_SERVICE_HOST or _PORT
	// itself.
	SkipOwnAPIServer SkipReason = "OwnAPIServer"
	// SkipExcludedNamespace: kube-system or watchgate's own namespace.
	SkipExcludedNamespace SkipReason = "ExcludedNamespace"
)

// Record is the value of AnnotationInjected.
type Record struct {
	// APIServer is host:port the pod's clients use.
	APIServer string `json:"apiServer"`
	// Volume is the projected volume mounted at TokenPath.
	Volume string `json:"volume"`
	// Replaced is the API server's volume it replaced.
	Replaced string `json:"replaced,omitempty"`
}

// Wanted reports whether a pod with podLabels in a namespace with nsLabels
// asks for routing, and whether it opted out explicitly: the pod's label
// wins; without one, the namespace's.
func Wanted(podLabels, nsLabels map[string]string) (wanted, optedOut bool) {
	switch podLabels[LabelInject] {
	case ValueEnabled:
		return true, false
	case ValueDisabled:
		return false, true
	}
	return nsLabels[LabelInject] == ValueEnabled, false
}

// Route routes pod to t in place, or leaves its spec alone and says why.
// It is idempotent: routing a routed pod changes nothing. Either way it
// records the outcome in the pod's annotations.
//
// Routed means: every container and init container gets
// KUBERNETES_SERVICE_HOST/PORT = t, and the kube-api-access-* projected
// volume is replaced, at the same index and under every mount, by
// VolumeName with the same sources except that the CA comes from
// ConfigMapName instead of kube-root-ca.crt.
func Route(pod *corev1.Pod, t Target) (SkipReason, string) {
	reason, msg := route(pod, t)
	if reason != "" {
		Skip(pod, reason, msg)
	}
	return reason, msg
}

// Skip annotates pod as left alone for reason.
func Skip(pod *corev1.Pod, reason SkipReason, msg string) {
	setAnnotation(pod, AnnotationStatus, StatusSkipped)
	setAnnotation(pod, AnnotationReason, string(reason)+": "+msg)
	delete(pod.Annotations, AnnotationInjected)
}

func route(pod *corev1.Pod, t Target) (SkipReason, string) {
	spec := &pod.Spec
	if spec.HostNetwork {
		return SkipHostNetwork, "the pod uses the host network, where watchgate's Service name may not resolve"
	}
	if a := spec.AutomountServiceAccountToken; a != nil && !*a {
		return SkipAutomountDisabled, "automountServiceAccountToken is false: the pod has no token to route"
	}
	oldIdx, ourIdx := -1, -1
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		switch {
		case v.Name == VolumeName:
			ourIdx = i
		case strings.HasPrefix(v.Name, apiAccessPrefix) && v.Projected != nil && hasToken(v.Projected):
			oldIdx = i
		}
	}
	all := allContainers(spec)
	for _, c := range all {
		for _, m := range c.VolumeMounts {
			if strings.TrimSuffix(m.MountPath, "/") != TokenPath {
				continue
			}
			if m.Name != VolumeName && (oldIdx < 0 || m.Name != spec.Volumes[oldIdx].Name) {
				return SkipOwnToken, "container " + c.Name + " mounts its own volume " + m.Name + " at " + TokenPath
			}
		}
		port := strconv.Itoa(int(t.Port))
		for _, e := range c.Env {
			if (e.Name == envHost && (e.ValueFrom != nil || e.Value != t.Host)) ||
				(e.Name == envPort && (e.ValueFrom != nil || e.Value != port)) {
				return SkipOwnAPIServer, "container " + c.Name + " sets " + e.Name + " itself"
			}
		}
	}
	if oldIdx < 0 && ourIdx < 0 {
		return SkipNoServiceAccountToken, "no kube-api-access volume to replace (is automount off for the service account?)"
	}

	rec := Record{APIServer: t.Host + ":" + strconv.Itoa(int(t.Port)), Volume: VolumeName}
	if prev, ok := pod.Annotations[AnnotationInjected]; ok {
		var p Record
		if json.Unmarshal([]byte(prev), &p) == nil {
			rec.Replaced = p.Replaced
		}
	}
	if oldIdx >= 0 {
		old := spec.Volumes[oldIdx]
		rec.Replaced = old.Name
		v := corev1.Volume{Name: VolumeName, VolumeSource: corev1.VolumeSource{Projected: withOurCA(old.Projected)}}
		if ourIdx >= 0 {
			// Both: a client re-added the API server's volume; keep ours.
			spec.Volumes = append(spec.Volumes[:oldIdx], spec.Volumes[oldIdx+1:]...)
		} else {
			spec.Volumes[oldIdx] = v
		}
		for _, c := range all {
			for i := range c.VolumeMounts {
				if c.VolumeMounts[i].Name == old.Name {
					c.VolumeMounts[i].Name = VolumeName
				}
			}
		}
	}
	for _, c := range all {
		setEnv(c, envHost, t.Host)
		setEnv(c, envPort, strconv.Itoa(int(t.Port)))
	}
	b, _ := json.Marshal(rec)
	setAnnotation(pod, AnnotationStatus, StatusInjected)
	setAnnotation(pod, AnnotationInjected, string(b))
	delete(pod.Annotations, AnnotationReason)
	return "", ""
}

func hasToken(p *corev1.ProjectedVolumeSource) bool {
	for _, s := range p.Sources {
		if s.ServiceAccountToken != nil {
			return true
		}
	}
	return false
}

// withOurCA copies the API server's projected sources with the CA taken
// from ConfigMapName.
func withOurCA(old *corev1.ProjectedVolumeSource) *corev1.ProjectedVolumeSource {
	p := old.DeepCopy()
	found := false
	for i := range p.Sources {
		s := &p.Sources[i]
		if s.ServiceAccountToken != nil && s.ServiceAccountToken.ExpirationSeconds == nil {
			exp := DefaultTokenExpirationSeconds
			s.ServiceAccountToken.ExpirationSeconds = &exp
		}
		if s.ConfigMap != nil && s.ConfigMap.Name == rootCAName {
			s.ConfigMap.Name = ConfigMapName
			s.ConfigMap.Items = []corev1.KeyToPath{{Key: ConfigMapKey, Path: "ca.crt"}}
			found = true
		}
	}
	if !found {
		p.Sources = append(p.Sources, corev1.VolumeProjection{ConfigMap: &corev1.ConfigMapProjection{
			LocalObjectReference: corev1.LocalObjectReference{Name: ConfigMapName},
			Items:                []corev1.KeyToPath{{Key: ConfigMapKey, Path: "ca.crt"}},
		}})
	}
	return p
}

func allContainers(spec *corev1.PodSpec) []*corev1.Container {
	var cs []*corev1.Container
	for i := range spec.InitContainers {
		cs = append(cs, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		cs = append(cs, &spec.Containers[i])
	}
	return cs
}

// setEnv sets name=value, keeping the variable's position when present.
func setEnv(c *corev1.Container, name, value string) {
	for i := range c.Env {
		if c.Env[i].Name == name {
			c.Env[i].Value = value
			return
		}
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
}

func setAnnotation(pod *corev1.Pod, k, v string) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[k] = v
}
