package inject

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

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

// PodInjector is the mutating admission webhook for Pods (CREATE). It
// never rejects a pod: anything it cannot decide is admitted unchanged.
type PodInjector struct {
	// Reader reads namespaces (usually the manager's cache).
	Reader client.Reader
	// Target is watchgate's Service.
	Target Target
	// ExcludedNamespaces are never routed (kube-system and watchgate's
	// own namespace).
	ExcludedNamespaces []string
	// Decoder decodes the pod in a request.
	Decoder admission.Decoder
}

var _ admission.Handler = (*PodInjector)(nil)

// Handle answers one admission request with a JSON patch, or none.
func (p *PodInjector) Handle(ctx context.Context, req admission.Request) admission.Response {
	log := logf.FromContext(ctx)
	pod := &corev1.Pod{}
	if err := p.Decoder.Decode(req, pod); err != nil {
		podsTotal.WithLabelValues("error", "").Inc()
		return admission.Errored(http.StatusBadRequest, err)
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	var nsLabels map[string]string
	if pod.Labels[LabelInject] == "" {
		n := &corev1.Namespace{}
		if err := p.Reader.Get(ctx, types.NamespacedName{Name: ns}, n); err != nil && !apierrors.IsNotFound(err) {
			podsTotal.WithLabelValues("error", "").Inc()
			// Admitted unchanged, as with failurePolicy Ignore.
			return admission.Allowed("namespace unknown: " + err.Error())
		}
		nsLabels = n.Labels
	}
	wanted, optedOut := Wanted(pod.Labels, nsLabels)
	if !wanted && !optedOut {
		podsTotal.WithLabelValues("unlabelled", "").Inc()
		return admission.Allowed("not labelled " + LabelInject + "=" + ValueEnabled)
	}
	raw := req.Object.Raw
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
	out, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.PatchResponseFromRaw(raw, out)
	if len(resp.Patches) > 0 {
		log.V(1).Info("Mutated pod", "namespace", ns, "generateName", pod.GenerateName, "name", pod.Name, "status", status, "reason", reason)
	}
	return resp
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
