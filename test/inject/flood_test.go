package inject

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/inject"
)

// floodHeapBoundMiB is the most the heap may grow while the webhook is
// flooded: what the reviews decoded at once (two by default) of the
// largest allowed size, and the garbage they leave before the collector
// runs, come to.
const floodHeapBoundMiB = 48

// bigReview is an AdmissionReview of a labelled pod, just under size bytes:
// one container with as many tiny environment variables as fit, the worst
// case for what decoding turns a byte into.
func bigReview(t *testing.T, size int) []byte {
	t.Helper()
	var env bytes.Buffer
	for i := 0; env.Len() < size-4096; i++ {
		if i > 0 {
			env.WriteByte(',')
		}
		fmt.Fprintf(&env, `{"name":"E%d"}`, i)
	}
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"big","namespace":"flood","labels":{"watchgate.io/inject":"enabled"}},` +
		`"spec":{"containers":[{"name":"c","image":"example.invalid/c:1","env":[` + env.String() + `],` +
		`"volumeMounts":[{"name":"kube-api-access-abcde","mountPath":"/var/run/secrets/kubernetes.io/serviceaccount","readOnly":true}]}],` +
		`"volumes":[{"name":"kube-api-access-abcde","projected":{"sources":[{"serviceAccountToken":{"path":"token","expirationSeconds":3607}},` +
		`{"configMap":{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}}]}}]}}`
	review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"flood","kind":{"group":"","version":"v1","kind":"Pod"},` +
		`"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"flood","operation":"CREATE",` +
		`"userInfo":{"username":"flooder"},"object":` + pod + `}}`
	if len(review) > size {
		t.Fatalf("review is %d bytes, over %d", len(review), size)
	}
	return []byte(review)
}

// heapPeak samples the heap's object bytes every millisecond until stop is
// closed, and returns the highest sample.
func heapPeak(stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak uint64
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-stop:
				out <- peak
				return
			case <-t.C:
			}
		}
	}()
	return out
}

func heapNow() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// The worst AdmissionReview flood anyone who can reach the webhook port can
// send: 16 clients at once, each posting reviews as large as the webhook
// reads (3 MiB, kube-apiserver's own request limit), then 16 posting 6.6
// MiB bodies, half of them without Content-Length. The injector's heap
// grows by at most floodHeapBoundMiB, every review is answered (a patch,
// or 429 for those that found no slot) and every oversized body refused
// (413, or 429 for a chunked one that found no slot).
func TestAdmissionReviewFloodStaysWithinAHeapBound(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, newPKI(t).caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	startInjector(t, inject.Target{Host: "watchgate.watchgate-system.svc.cluster.local", Port: 443}, caFile)
	addr := net.JoinHostPort(env.Webhooks.LocalServingHost, strconv.Itoa(env.Webhooks.LocalServingPort))
	url := "https://" + addr + inject.WebhookPath

	review := bigReview(t, inject.DefaultMaxReviewBytes)
	oversized := bytes.Repeat([]byte(" "), 6600<<10)
	const clients, rounds = 16, 3
	transport := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: clients} //nolint:gosec // the test's own webhook
	defer transport.CloseIdleConnections()
	hc := &http.Client{Transport: transport, Timeout: 2 * time.Minute}

	// Warm up: one review routed, so that the caches and the TLS state
	// are in the baseline.
	code, body := send(t, hc, url, review, true)
	if code != http.StatusOK || !strings.Contains(body, `"patch"`) {
		t.Fatalf("one review: HTTP %d %.300s, want 200 with a patch", code, body)
	}

	base := heapNow()
	stop := make(chan struct{})
	peak := heapPeak(stop)
	var ok, busy, tooLarge, other atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for range rounds {
				switch code, _ := send(t, hc, url, review, true); code {
				case http.StatusOK:
					ok.Add(1)
				case http.StatusTooManyRequests:
					busy.Add(1)
				default:
					other.Add(1)
				}
			}
			// One sent chunked waits for a slot like any review: 413
			// once it reads past the limit, or 429.
			switch code, _ := send(t, hc, url, oversized, c%2 == 0); code {
			case http.StatusRequestEntityTooLarge:
				tooLarge.Add(1)
			case http.StatusTooManyRequests:
				busy.Add(1)
			default:
				other.Add(1)
			}
		})
	}
	wg.Wait()
	close(stop)
	grown := float64(int64(<-peak)-int64(base)) / (1 << 20)
	t.Logf("AdmissionReview flood: %d clients × %d reviews of %d bytes, then %d bodies of %d bytes: heap peak %.1f MiB above %.1f MiB; %d patched, %d 429, %d 413",
		clients, rounds, len(review), clients, len(oversized), grown, float64(base)/(1<<20), ok.Load(), busy.Load(), tooLarge.Load())
	if grown > floodHeapBoundMiB {
		t.Errorf("heap grew by %.1f MiB under the flood, want at most %d MiB", grown, floodHeapBoundMiB)
	}
	if ok.Load() == 0 || other.Load() != 0 || tooLarge.Load()+busy.Load() != clients*(rounds+1)-ok.Load() {
		t.Errorf("answers: %d patched, %d 429, %d 413, %d other; want some patched, the rest 429 or 413 and nothing else", ok.Load(), busy.Load(), tooLarge.Load(), other.Load())
	}
}

// send posts body (with its Content-Length, or chunked) and returns the
// status and the start of the answer.
func send(t *testing.T, hc *http.Client, url string, body []byte, withLength bool) (int, string) {
	var r io.Reader = bytes.NewReader(body)
	if !withLength {
		r = io.MultiReader(r) // hides the length: sent chunked
	}
	req, err := http.NewRequest(http.MethodPost, url, r)
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		// The server may close the connection after answering 413 while
		// the client still writes the body it will not read.
		if !withLength || len(body) > inject.DefaultMaxReviewBytes {
			return http.StatusRequestEntityTooLarge, err.Error()
		}
		t.Error(err)
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// A pod whose review is over the webhook's limit is created by the API
// server all the same, unrouted: the webhook's 413 is a failed call, and
// failurePolicy is Ignore. A small pod is still routed.
func TestAPodOverTheReviewLimitIsCreatedUnrouted(t *testing.T) {
	p := startProxy(t)
	startInjector(t, p.Target, filepath.Join(p.Dir, "ca.crt"), func(o *inject.Options) {
		o.Limits.MaxReviewBytes = 64 << 10
	})
	ns := uniqueName("limit")
	namespace(t, ns, map[string]string{inject.LabelInject: inject.ValueEnabled}, "agent")
	big := simplePod("big", "agent")
	big.Annotations = map[string]string{"filler": strings.Repeat("x", 100<<10)}
	got := createPod(t, ns, big)
	if s := got.Annotations[inject.AnnotationStatus]; s != "" || len(got.Spec.Containers[0].Env) != 0 {
		t.Errorf("a pod over the limit was touched: status %q env %v", s, got.Spec.Containers[0].Env)
	}
	assertRouted(t, createPod(t, ns, simplePod("small", "agent")), p.Target)
}

// The injector caches pods' metadata only, and only labelled pods': an
// unlabelled pod is not in its cache, a labelled one is there by name and
// labels, without its annotations or spec.
func TestTheInjectorCachesLabelledPodsMetadataOnly(t *testing.T) {
	p := startProxy(t)
	pieces := startInjector(t, p.Target, filepath.Join(p.Dir, "ca.crt"))
	ns := uniqueName("cache")
	namespace(t, ns, nil, "agent")
	labelled := simplePod("labelled", "agent")
	labelled.Labels = map[string]string{inject.LabelInject: inject.ValueEnabled}
	createPod(t, ns, labelled)
	createPod(t, ns, simplePod("unlabelled", "agent"))

	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	eventually(t, 30*time.Second, "the labelled pod in the injector's cache", func() (bool, error) {
		err := pieces.Publisher.Local.List(context.Background(), list, client.InNamespace(ns))
		return err == nil && len(list.Items) > 0, err
	})
	if len(list.Items) != 1 || list.Items[0].Name != "labelled" {
		t.Fatalf("cached pods in %s: %v, want only the labelled one", ns, names(list.Items))
	}
	if a := list.Items[0].Annotations; len(a) != 0 {
		t.Errorf("the cached pod keeps its annotations: %v", a)
	}
	if list.Items[0].Labels[inject.LabelInject] != inject.ValueEnabled {
		t.Errorf("the cached pod lost its labels: %v", list.Items[0].Labels)
	}
}

func names(items []metav1.PartialObjectMetadata) []string {
	var out []string
	for _, i := range items {
		out = append(out, i.Name)
	}
	return out
}
