package inject

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// reviewOf wraps pod in an AdmissionReview for CREATE, as kube-apiserver
// sends it.
func reviewOf(t testing.TB, pod *corev1.Pod) []byte {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "uid-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: pod.Namespace, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// noNamespaces is a reader that knows no namespace (the test pods carry
// the label themselves).
type noNamespaces struct{ client.Reader }

func (noNamespaces) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return nil
}

func post(t testing.TB, h http.Handler, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// The patch the webhook answers with, applied to the whole pod as the API
// server applies it, gives exactly what Route does to the whole pod: the
// webhook decodes only a subset of the pod, yet loses nothing of it.
func TestPatchOfASubsetIsRouteOfTheWholePod(t *testing.T) {
	labelled := func(edit func(*corev1.Pod)) *corev1.Pod {
		p := admitted()
		p.Labels = map[string]string{LabelInject: ValueEnabled, "app": "agent"}
		p.Spec.Containers[0].Image = "example.invalid/agent:1"
		p.Spec.Containers[0].Args = []string{"--verbose"}
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/os": "linux"}
		if edit != nil {
			edit(p)
		}
		return p
	}
	routed := labelled(nil)
	Route(routed, target)
	for name, pod := range map[string]*corev1.Pod{
		"a pod the API server admitted": labelled(nil),
		"a pod with annotations of its own": labelled(func(p *corev1.Pod) {
			p.Annotations = map[string]string{"team": "a/b~c", AnnotationReason: "stale"}
		}),
		"a pod whose first container has no env": labelled(func(p *corev1.Pod) { p.Spec.Containers[0].Env = nil }),
		"a pod on the host network":              labelled(func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
		"a pod that sets its own API server": labelled(func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: envHost, Value: "10.0.0.1"})
		}),
		"a pod routed already": routed.DeepCopy(),
		"a routed pod the API server gave its volume again": func() *corev1.Pod {
			p := routed.DeepCopy()
			p.Spec.Volumes = append(p.Spec.Volumes, admitted().Spec.Volumes[1])
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "kube-api-access-x7k2p", MountPath: "/extra"})
			return p
		}(),
		"a pod that opted out": labelled(func(p *corev1.Pod) { p.Labels[LabelInject] = ValueDisabled }),
		"a pod with automount off": labelled(func(p *corev1.Pod) {
			p.Spec.AutomountServiceAccountToken = ptr.To(false)
		}),
	} {
		t.Run(name, func(t *testing.T) {
			want := pod.DeepCopy()
			if pod.Labels[LabelInject] == ValueDisabled {
				Skip(want, SkipOptedOut, "the pod's label "+LabelInject+" is "+ValueDisabled)
			} else {
				Route(want, target)
			}
			h := &PodInjector{Reader: noNamespaces{}, Target: target}
			w := post(t, h, reviewOf(t, pod))
			if w.Code != http.StatusOK {
				t.Fatalf("HTTP %d: %s", w.Code, w.Body)
			}
			var answer admissionv1.AdmissionReview
			if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil {
				t.Fatal(err)
			}
			if r := answer.Response; r == nil || !r.Allowed || r.UID != "uid-1" || answer.Kind != "AdmissionReview" {
				t.Fatalf("answer = %s", w.Body)
			}
			raw, _ := json.Marshal(pod)
			if p := answer.Response.Patch; len(p) > 0 {
				patch, err := jsonpatch.DecodePatch(p)
				if err != nil {
					t.Fatalf("patch %s: %v", p, err)
				}
				if raw, err = patch.Apply(raw); err != nil {
					t.Fatalf("apply %s: %v", p, err)
				}
			}
			got := &corev1.Pod{}
			if err := json.Unmarshal(raw, got); err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("patched pod differs from Route's:\npatch %s\ngot  %+v\nwant %+v", answer.Response.Patch, got, want)
			}
		})
	}
}

// What an admission may cost is bounded before anything is read: a body
// over the limit is 413 unread, one slot too many is 429 after QueueWait,
// and either is an HTTP error the API server hands to failurePolicy.
func TestReviewsOverTheLimitsAreRefusedUnread(t *testing.T) {
	h := &PodInjector{Reader: noNamespaces{}, Target: target, Limits: AdmissionLimits{MaxReviewBytes: 64 << 10, MaxConcurrent: 1, QueueWait: 1}}
	big := bytes.Repeat([]byte(" "), 128<<10)
	if w := post(t, h, big); w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), `"kind":"Status"`) {
		t.Errorf("a 128 KiB body with a 64 KiB limit: HTTP %d %s, want 413 and a Status", w.Code, w.Body)
	}
	// Without Content-Length the reader stops at the limit.
	r := httptest.NewRequest(http.MethodPost, WebhookPath, bytes.NewReader(big))
	r.ContentLength = -1
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("a chunked 128 KiB body: HTTP %d %s, want 413", w.Code, w.Body)
	}

	release, ok := h.acquire(context.Background(), h.Limits.withDefaults())
	if !ok {
		t.Fatal("the one slot was not free")
	}
	w = post(t, h, reviewOf(t, admitted()))
	release()
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Errorf("a review while the one slot is taken: HTTP %d %v, want 429 with Retry-After", w.Code, w.Header())
	}
	if w := post(t, h, []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`)); w.Code != http.StatusBadRequest {
		t.Errorf("a review without a request: HTTP %d, want 400", w.Code)
	}
	if w := post(t, h, []byte(`{`)); w.Code != http.StatusBadRequest {
		t.Errorf("a body that is not JSON: HTTP %d, want 400", w.Code)
	}
}

// Labels or annotations over the API server's own 256 KiB are not decoded:
// the pod is admitted unchanged, with a warning.
func TestHugeAnnotationsAreNotDecoded(t *testing.T) {
	pod := admitted()
	pod.Labels = map[string]string{LabelInject: ValueEnabled}
	pod.Annotations = map[string]string{}
	for i := range 30000 {
		pod.Annotations[strings.Repeat("k", 3)+string(rune('a'+i%26))+strings.Repeat("x", i%7)+itoa(i)] = "v"
	}
	h := &PodInjector{Reader: noNamespaces{}, Target: target}
	w := post(t, h, reviewOf(t, pod))
	var answer admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil || answer.Response == nil {
		t.Fatalf("HTTP %d %s", w.Code, w.Body)
	}
	if r := answer.Response; !r.Allowed || len(r.Patch) != 0 || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "256 KiB") {
		t.Errorf("response = %+v, want allowed, no patch, a warning naming 256 KiB", r)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
