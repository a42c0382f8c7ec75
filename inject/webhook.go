package inject

import (
	"context"
	"encoding/json"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// WebhookPath is where the webhook server serves PodInjector.
const WebhookPath = "/mutate-v1-pod"

var podsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "watchgate_inject_pods_total",
	Help: "Pods the injection webhook was asked about, by outcome (injected, skipped, unlabelled, error) and reason (a SkipReason, or empty); a few fixed values each.",
}, []string{"outcome", "reason"})

func init() { metrics.Registry.MustRegister(podsTotal) }

// PodInjector is the mutating admission webhook for Pods (CREATE), an
// http.Handler for the webhook server. It never denies a pod in its
// answer: a pod it cannot route is admitted unchanged. A request it does
// not read (over the body limit, too many at once, not an AdmissionReview
// it can decode) gets an HTTP error instead (413, 429, 400), which the API
// server counts as a failed call: the webhook's failurePolicy decides
// (Ignore, the chart's: the pod is created unrouted). What one admission may cost is
// bounded (see AdmissionLimits): the body it reads, how many it serves at
// once, and what it decodes (only the fields routing needs, podSubset).
type PodInjector struct {
	// Reader reads namespaces' metadata (the injector's own cache).
	Reader client.Reader
	// Target is watchgate's Service.
	Target Target
	// ExcludedNamespaces are never routed (kube-system and watchgate's
	// own namespace).
	ExcludedNamespaces []string
	// Limits bound what admissions may cost; zero fields take the
	// defaults.
	Limits AdmissionLimits

	once  sync.Once
	slots chan struct{}
}

// admit routes the pod of one review and returns the JSON patch (nil for
// none) and, when the pod was admitted unchanged for a reason worth
// telling its creator, a warning.
func (p *PodInjector) admit(ctx context.Context, namespace string, obj *podSubset) (patch []byte, warning string) {
	log := logf.FromContext(ctx)
	pod, err := obj.pod()
	if err != nil {
		podsTotal.WithLabelValues("error", "").Inc()
		return nil, "watchgate: pod not routed: " + err.Error()
	}
	ns := namespace
	if ns == "" {
		ns = pod.Namespace
	}
	var nsLabels map[string]string
	if pod.Labels[LabelInject] == "" {
		n := metadataOf("Namespace")
		if err := p.Reader.Get(ctx, types.NamespacedName{Name: ns}, n); err != nil && !apierrors.IsNotFound(err) {
			podsTotal.WithLabelValues("error", "").Inc()
			// Admitted unchanged, as with failurePolicy Ignore.
			return nil, "watchgate: pod not routed: namespace unknown: " + err.Error()
		}
		nsLabels = n.Labels
	}
	wanted, optedOut := Wanted(pod.Labels, nsLabels)
	if !wanted && !optedOut {
		podsTotal.WithLabelValues("unlabelled", "").Inc()
		return nil, ""
	}
	before := snapshotOf(pod, obj.envTotals())
	switch {
	case slices.Contains(p.ExcludedNamespaces, ns):
		Skip(pod, SkipExcludedNamespace, "namespace "+ns+" is never routed")
	case optedOut:
		Skip(pod, SkipOptedOut, "the pod's label "+LabelInject+" is "+ValueDisabled)
	default:
		Route(pod, p.Target)
	}
	status := pod.Annotations[AnnotationStatus]
	reason := ""
	if status == StatusSkipped {
		reason = reasonOf(pod.Annotations[AnnotationReason])
	}
	podsTotal.WithLabelValues(status, reason).Inc()
	ops := patchFrom(before, pod)
	if len(ops) == 0 {
		return nil, ""
	}
	out, err := json.Marshal(ops)
	if err != nil {
		podsTotal.WithLabelValues("error", "").Inc()
		return nil, "watchgate: pod not routed: " + err.Error()
	}
	log.V(1).Info("Mutated pod", "namespace", ns, "generateName", pod.GenerateName, "name", pod.Name, "status", status, "reason", reason)
	return out, ""
}

// reasonOf is the SkipReason at the start of an AnnotationReason value.
func reasonOf(s string) string {
	for i := range len(s) {
		if s[i] == ':' {
			return s[:i]
		}
	}
	return s
}
