package inject

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The Event UnroutedPods records on a pod.
const (
	// ReasonNotRouted is the reason of the Warning Event on a pod that
	// asked for routing and was created without it.
	ReasonNotRouted = "NotRouted"
	actionNotRouted = "Admitted"
)

// maxUnroutedRemembered bounds the pods UnroutedPods remembers (a UID
// each, under 100 bytes): beyond it, it notices no more pods until some
// are deleted.
const maxUnroutedRemembered = 10000

// The Events it records: 5 a second, bursts of 50 (a webhook that was
// down during a large rollout leaves many pods at once); beyond, the
// metrics still count them.
const (
	unroutedEventsPerSecond = 5
	unroutedEventBurst      = 50
)

// podListPage is how many pods' metadata one list page holds: the most
// UnroutedPods keeps in memory at once.
const podListPage = 500

var (
	unroutedPods = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_inject_unrouted_pods",
		Help: "Pods that asked for routing (their label or their namespace's) and exist unrouted, as the leader counts them (at most 10000); no labels.",
	})
	unroutedPodsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "watchgate_inject_unrouted_pods_total",
		Help: "Pods noticed created (or found, when the leader starts) unrouted although they asked for routing; each once per leader; no labels.",
	})
)

func init() { metrics.Registry.MustRegister(unroutedPods, unroutedPodsTotal) }

// NotRouted reports whether a pod with this metadata, in a namespace with
// nsLabels, asked for routing and was admitted without the webhook's
// answer: no AnnotationStatus (the webhook writes it on every pod it
// routes or skips). Pods of excluded namespaces and pods that opted out
// never are.
func NotRouted(pod *metav1.PartialObjectMetadata, nsLabels map[string]string, excluded []string) bool {
	if slices.Contains(excluded, pod.Namespace) {
		return false
	}
	if wanted, optedOut := Wanted(pod.Labels, nsLabels); !wanted || optedOut {
		return false
	}
	return pod.Annotations[AnnotationStatus] == ""
}

// Its Events are written in the pods' namespaces.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// UnroutedPods (leader only) notices pods that asked for routing and were
// created without it — the webhook did not answer and its failurePolicy
// Ignore admitted them, or the namespace got its label after them — and
// tells an operator: a Warning Event NotRouted on the pod, and the metrics
// watchgate_inject_unrouted_pods (how many exist) and
// watchgate_inject_unrouted_pods_total.
//
// It lists every pod's metadata when it starts (a page at a time, kept no
// longer than the page) and then watches them, keeping only the UIDs of the
// unrouted ones it noticed (at most maxUnroutedRemembered): a cluster's
// routed or unlabelled pods cost it nothing. Watchgate being down is when
// pods go unrouted, so the list at start-up is what finds them.
type UnroutedPods struct {
	// Pods reads pods' metadata.
	Pods metadata.Getter
	// Namespaces reads namespaces' labels (the injector's own cache).
	Namespaces client.Reader
	// ExcludedNamespaces are never routed.
	ExcludedNamespaces []string
	// Recorder records the Events.
	Recorder events.EventRecorder

	mu     sync.Mutex
	known  map[types.UID]struct{}
	events *rate.Limiter
}

// NeedLeaderElection is true: one replica tells.
func (u *UnroutedPods) NeedLeaderElection() bool { return true }

// Start lists and watches pods until ctx ends.
func (u *UnroutedPods) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("unrouted-pods")
	u.events = rate.NewLimiter(unroutedEventsPerSecond, unroutedEventBurst)
	for ctx.Err() == nil {
		rv, err := u.relist(ctx)
		if err == nil {
			err = u.watch(ctx, rv)
		}
		switch {
		case ctx.Err() != nil || err == nil:
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			// The watch's version was compacted away: list again at once.
			log.V(1).Info("Listing pods again", "reason", err.Error())
		default:
			log.Error(err, "Failed to list or watch pods; listing again in a few seconds")
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}
	return nil
}

// relist lists every pod's metadata, a page at a time, notices the
// unrouted ones and forgets those that are gone; it returns the list's
// resourceVersion.
func (u *UnroutedPods) relist(ctx context.Context) (string, error) {
	seen := map[types.UID]struct{}{}
	opts := metav1.ListOptions{Limit: podListPage}
	for {
		page, err := u.Pods.List(ctx, opts)
		if err != nil {
			return "", err
		}
		for i := range page.Items {
			p := &page.Items[i]
			if u.check(ctx, p) {
				seen[p.UID] = struct{}{}
			}
		}
		if page.Continue == "" {
			u.mu.Lock()
			for uid := range u.known {
				if _, ok := seen[uid]; !ok {
					delete(u.known, uid)
				}
			}
			unroutedPods.Set(float64(len(u.known)))
			u.mu.Unlock()
			return page.ResourceVersion, nil
		}
		opts.Continue = page.Continue
	}
}

// watch follows pods from rv until the watch fails; a watch that ends
// after its timeout is opened again from the last version seen. It
// returns nil when ctx ends, an error when the pods must be listed again.
func (u *UnroutedPods) watch(ctx context.Context, rv string) error {
	for ctx.Err() == nil {
		timeout := int64(300 + rand.IntN(300)) // as a Reflector spreads its watches
		w, err := u.Pods.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout})
		if err != nil {
			return err
		}
		rv, err = u.drain(ctx, w, rv)
		w.Stop()
		if err != nil {
			return err
		}
	}
	return nil
}

// drain handles one watch's events and returns the last resourceVersion
// it saw.
func (u *UnroutedPods) drain(ctx context.Context, w watch.Interface, rv string) (string, error) {
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			// 410 Expired among them: list again.
			return rv, fmt.Errorf("watch pods from %s: %w", rv, apierrors.FromObject(ev.Object))
		}
		p, ok := ev.Object.(*metav1.PartialObjectMetadata)
		if !ok {
			continue
		}
		rv = p.ResourceVersion
		switch ev.Type {
		case watch.Added:
			u.check(ctx, p)
		case watch.Deleted:
			u.forget(p.UID)
		}
	}
	return rv, nil
}

// check notices p if it is unrouted and reports whether it is.
func (u *UnroutedPods) check(ctx context.Context, p *metav1.PartialObjectMetadata) bool {
	var nsLabels map[string]string
	if p.Labels[LabelInject] == "" {
		ns := metadataOf("Namespace")
		if err := u.Namespaces.Get(ctx, types.NamespacedName{Name: p.Namespace}, ns); err != nil {
			return false
		}
		nsLabels = ns.Labels
	}
	if !NotRouted(p, nsLabels, u.ExcludedNamespaces) {
		u.forget(p.UID)
		return false
	}
	u.mu.Lock()
	if u.known == nil {
		u.known = map[types.UID]struct{}{}
	}
	_, had := u.known[p.UID]
	fresh := !had && len(u.known) < maxUnroutedRemembered
	if fresh {
		u.known[p.UID] = struct{}{}
		unroutedPods.Set(float64(len(u.known)))
		unroutedPodsTotal.Inc()
	}
	u.mu.Unlock()
	if fresh && u.events.Allow() {
		regarding := &metav1.PartialObjectMetadata{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion},
		}
		u.Recorder.Eventf(regarding, nil, corev1.EventTypeWarning, ReasonNotRouted, actionNotRouted,
			"Pod asked for routing through watchgate (%s=%s on the pod or its namespace) but was admitted without it: "+
				"the injection webhook did not answer (failurePolicy Ignore) or the label came later. It talks to the API server directly; "+
				"recreate it to route it", LabelInject, ValueEnabled)
	}
	return true
}

func (u *UnroutedPods) forget(uid types.UID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.known[uid]; ok {
		delete(u.known, uid)
		unroutedPods.Set(float64(len(u.known)))
	}
}
