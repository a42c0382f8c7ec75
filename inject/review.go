package inject

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Defaults of AdmissionLimits.
const (
	// DefaultMaxReviewBytes is kube-apiserver's own limit on a request
	// body (3 MiB): a pod the API server accepted, with the review around
	// it, fits (etcd stores at most 1.5 MiB of it).
	DefaultMaxReviewBytes = 3 << 20
	// DefaultMaxConcurrentReviews: two reviews decoded at once keep the
	// injector's memory for admissions near a few bodies; a pod's review
	// takes about a millisecond.
	DefaultMaxConcurrentReviews = 2
	// DefaultReviewQueueWait is how long a review waits for a free slot
	// before it is answered 429 (well inside the webhook's timeoutSeconds).
	DefaultReviewQueueWait = time.Second
	// reviewReadTimeout is how long a review's body may take to arrive
	// once it has a slot: kube-apiserver sends it at once, and a client
	// trickling it must not hold a slot for longer.
	reviewReadTimeout = 10 * time.Second
)

// AdmissionLimits bound what admission reviews may cost the process. A
// review over a limit gets an HTTP error (413 or 429) with a Status body,
// which kube-apiserver treats as a failed call: the webhook's
// failurePolicy decides (Ignore: the pod is created unrouted).
type AdmissionLimits struct {
	// MaxReviewBytes is the largest request body read; default
	// DefaultMaxReviewBytes. Larger: 413, unread.
	MaxReviewBytes int64
	// MaxConcurrent is how many reviews are read and decoded at once;
	// default DefaultMaxConcurrentReviews.
	MaxConcurrent int
	// QueueWait is how long a review waits for one of those slots before
	// it gets 429; default DefaultReviewQueueWait.
	QueueWait time.Duration
}

func (l AdmissionLimits) withDefaults() AdmissionLimits {
	if l.MaxReviewBytes <= 0 {
		l.MaxReviewBytes = DefaultMaxReviewBytes
	}
	if l.MaxConcurrent <= 0 {
		l.MaxConcurrent = DefaultMaxConcurrentReviews
	}
	if l.QueueWait <= 0 {
		l.QueueWait = DefaultReviewQueueWait
	}
	return l
}

var reviewsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "watchgate_inject_reviews_refused_total",
	Help: "Admission reviews the injection webhook answered with an HTTP error before reading them, by reason (TooLarge: 413, Busy: 429, Invalid: 400); the webhook's failurePolicy then decides.",
}, []string{"reason"})

func init() { metrics.Registry.MustRegister(reviewsRefused) }

// podReview is an admission.k8s.io/v1 AdmissionReview with only what the
// injector reads; the pod is decoded as podSubset.
type podReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID       types.UID               `json:"uid"`
		Kind      metav1.GroupVersionKind `json:"kind"`
		Namespace string                  `json:"namespace"`
		Operation admissionv1.Operation   `json:"operation"`
		Object    *podSubset              `json:"object"`
	} `json:"request"`
}

var podKind = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}

// ServeHTTP answers one AdmissionReview: it waits up to QueueWait for a
// slot, reads at most MaxReviewBytes and decodes the pod's subset.
func (p *PodInjector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	lim := p.Limits.withDefaults()
	if r.Method != http.MethodPost {
		refuse(w, "Invalid", apierrors.NewMethodNotSupported(admissionv1.Resource("admissionreviews"), r.Method))
		return
	}
	if r.ContentLength > lim.MaxReviewBytes {
		refuse(w, "TooLarge", tooLarge(lim.MaxReviewBytes))
		return
	}
	release, ok := p.acquire(r.Context(), lim)
	if !ok {
		refuse(w, "Busy", apierrors.NewTooManyRequests("watchgate: too many admission reviews at once", 1))
		return
	}
	defer release()

	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(reviewReadTimeout))
	body, err := readBody(w, r, lim.MaxReviewBytes)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			refuse(w, "TooLarge", tooLarge(lim.MaxReviewBytes))
			return
		}
		refuse(w, "Invalid", apierrors.NewBadRequest("watchgate: read admission review: "+err.Error()))
		return
	}
	var review podReview
	if err := json.Unmarshal(body, &review); err != nil {
		refuse(w, "Invalid", apierrors.NewBadRequest("watchgate: decode admission review: "+err.Error()))
		return
	}
	if review.Request == nil || review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		refuse(w, "Invalid", apierrors.NewBadRequest("watchgate: want an admission.k8s.io/v1 AdmissionReview with a request"))
		return
	}
	req := review.Request
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation == admissionv1.Create && req.Kind == podKind && req.Object != nil {
		patch, warning := p.admit(logf.IntoContext(r.Context(), logf.FromContext(r.Context()).WithValues("uid", req.UID)), req.Namespace, req.Object)
		if patch != nil {
			pt := admissionv1.PatchTypeJSONPatch
			resp.Patch, resp.PatchType = patch, &pt
		}
		if warning != "" {
			resp.Warnings = []string{warning}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	})
}

// acquire takes one of the MaxConcurrent slots, waiting up to QueueWait.
func (p *PodInjector) acquire(ctx context.Context, lim AdmissionLimits) (release func(), ok bool) {
	p.once.Do(func() { p.slots = make(chan struct{}, lim.MaxConcurrent) })
	select {
	case p.slots <- struct{}{}:
		return func() { <-p.slots }, true
	default:
	}
	t := time.NewTimer(lim.QueueWait)
	defer t.Stop()
	select {
	case p.slots <- struct{}{}:
		return func() { <-p.slots }, true
	case <-t.C:
	case <-ctx.Done():
	}
	return nil, false
}

// readBody reads r's body, at most max bytes, into one buffer sized by
// Content-Length when the client sent one.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, max)
	defer body.Close()
	if n := r.ContentLength; n >= 0 {
		buf := make([]byte, n)
		if _, err := io.ReadFull(body, buf); err != nil {
			return nil, err
		}
		// Anything past Content-Length is not the client's body.
		return buf, nil
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(body); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func tooLarge(max int64) *apierrors.StatusError {
	return apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("watchgate: admission review over %s bytes", strconv.FormatInt(max, 10)))
}

// refuse answers with err's Status and code before (or instead of) reading
// the review.
func refuse(w http.ResponseWriter, reason string, err *apierrors.StatusError) {
	reviewsRefused.WithLabelValues(reason).Inc()
	st := err.Status()
	st.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}
	w.Header().Set("Content-Type", "application/json")
	if st.Details != nil && st.Details.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(st.Details.RetryAfterSeconds)))
	}
	w.WriteHeader(int(st.Code))
	_ = json.NewEncoder(w).Encode(st)
}
