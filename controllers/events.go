package controllers

import (
	"context"

	"golang.org/x/time/rate"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

// WatchBudgets are cluster-scoped, and the events API writes Events about
// cluster-scoped objects in the namespace "default" (client-go
// tools/events), so that is the only namespace watchgate may write Events in.
// +kubebuilder:rbac:groups=events.k8s.io,namespace=default,resources=events,verbs=create;patch

// throttleQueueSize bounds the events waiting to be recorded; beyond it they
// are dropped (and counted), never waited for.
const throttleQueueSize = 1024

// A replica records at most eventBurst Events at once and eventsPerSecond
// after that, whatever the number of identities being throttled: a storm of
// many identities must not become a storm of Events. The rest are dropped
// and counted (watchgate_throttle_events_total{result="dropped"}).
const (
	eventsPerSecond = 1
	eventBurst      = 30
)

// Event reasons are the engine's (RateLimited, TooManyWatches, BackingOff,
// StaleResourceVersion); the action says what was done.
const (
	actionReject = "Reject"
	actionDryRun = "DryRun"
)

// ThrottleEvents records an Event on a WatchBudget when one of the
// identities it governs starts being throttled. Create it with the manager,
// before the engine; pass its OnThrottled as ratelimit.Options.OnThrottled,
// and hand it to SetupWithManager, which starts it on every replica.
//
// Aggregation is the engine's: it calls OnThrottled at most once per
// budget × identity per ratelimit.Options.ThrottleNotifyInterval, so a storm
// of rejected requests becomes one Event per identity per interval. The
// Event's related object names the identity (kind User, or ServiceAccount
// with its namespace), so that the events API, which folds isomorphic events
// into a series, keeps one Event per identity and counts its repeats rather
// than merging different identities. OnThrottled never blocks the request
// that triggered it: it queues, and drops when the queue is full.
type ThrottleEvents struct {
	queue   chan throttled
	limiter *rate.Limiter
	clock   clock.PassiveClock

	reader   client.Reader
	recorder events.EventRecorder
}

type throttled struct {
	budget, user string
	reason       ratelimit.Reason
	dryRun       bool
}

// NewThrottleEvents returns a ThrottleEvents that reads budgets from mgr's
// cache and records Events with mgr's recorder (reporting controller
// "watchgate"); it queues from the start and records once SetupWithManager
// has started it. A nil clock is the real one.
func NewThrottleEvents(mgr manager.Manager, c clock.PassiveClock) *ThrottleEvents {
	if c == nil {
		c = clock.RealClock{}
	}
	return &ThrottleEvents{
		queue:    make(chan throttled, throttleQueueSize),
		limiter:  rate.NewLimiter(eventsPerSecond, eventBurst),
		clock:    c,
		reader:   mgr.GetCache(),
		recorder: mgr.GetEventRecorder("watchgate"),
	}
}

// OnThrottled queues an Event; it has the signature of
// ratelimit.Options.OnThrottled and never blocks.
func (t *ThrottleEvents) OnThrottled(budget, user string, reason ratelimit.Reason, dryRun bool) {
	select {
	case t.queue <- throttled{budget: budget, user: user, reason: reason, dryRun: dryRun}:
	default:
		throttleEventsTotal.WithLabelValues("dropped").Inc()
	}
}

// NeedLeaderElection is false: each replica reports whom it throttles.
func (t *ThrottleEvents) NeedLeaderElection() bool { return false }

// Start records queued Events until ctx ends.
func (t *ThrottleEvents) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("throttle-events")
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-t.queue:
			if err := t.record(ctx, e); err != nil {
				log.Error(err, "Failed to record throttling event", "watchBudget", e.budget)
			}
		}
	}
}

func (t *ThrottleEvents) record(ctx context.Context, e throttled) error {
	if !t.limiter.AllowN(t.clock.Now(), 1) {
		throttleEventsTotal.WithLabelValues("dropped").Inc()
		return nil
	}
	var wb v1alpha1.WatchBudget
	if err := t.reader.Get(ctx, types.NamespacedName{Name: e.budget}, &wb); err != nil {
		throttleEventsTotal.WithLabelValues("dropped").Inc()
		if apierrors.IsNotFound(err) {
			return nil // the budget went away meanwhile
		}
		return err
	}
	user := e.user
	if len(user) > 256 {
		user = user[:256] + "..."
	}
	action, note := actionReject, "Rejecting requests of %q: %s"
	if e.dryRun {
		action, note = actionDryRun, "Would reject requests of %q (DryRun: admitted): %s"
	}
	t.recorder.Eventf(&wb, identityRef(e.user), corev1.EventTypeWarning, string(e.reason), action, note, user, e.reason.Text())
	throttleEventsTotal.WithLabelValues("recorded").Inc()
	return nil
}

// identityRef is the Event's related object: the identity throttled.
func identityRef(user string) *corev1.ObjectReference {
	if ns, name, err := serviceaccount.SplitUsername(user); err == nil {
		return &corev1.ObjectReference{Kind: "ServiceAccount", APIVersion: "v1", Namespace: ns, Name: name}
	}
	if len(user) > 253 {
		user = user[:253]
	}
	return &corev1.ObjectReference{Kind: "User", APIVersion: rbacv1.SchemeGroupVersion.String(), Name: user}
}
