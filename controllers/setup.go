package controllers

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/watchgate/watchgate/api/v1alpha1"
)

// Options configure the controllers.
type Options struct {
	// PodName is this replica's pod name: the key of its entries in
	// status.replicas and part of its field manager's name. Required; in a
	// cluster, the downward API's metadata.name (main defaults it).
	PodName string
	// Namespace is the namespace the replicas' pods run in (downward API
	// metadata.namespace). The leader prunes entries of pods missing from
	// it, while its own pod (PodName) is there. Empty disables pruning.
	Namespace string
	// Bootstrap are the budgets the leader keeps in place
	// (BootstrapReconciler), with Namespace as the install's name. Without
	// any, no bootstrap reconciler runs, and none deletes what an earlier
	// run created.
	Bootstrap []BootstrapBudget
	// ThrottleEvents, when set, is started to record Events; its
	// OnThrottled must be the engine's ratelimit.Options.OnThrottled. Build
	// it with NewThrottleEvents from the same manager.
	ThrottleEvents *ThrottleEvents
	// StatusInterval is how often replicas write their status entries;
	// DefaultStatusInterval (15 s) when zero.
	StatusInterval time.Duration
	// PruneInterval is how often the leader prunes; DefaultPruneInterval
	// (1 min) when zero.
	PruneInterval time.Duration
	// CounterRefreshInterval is how long an entry whose only change is in
	// its cumulative decision counts waits to be rewritten;
	// DefaultCounterRefreshInterval (5 min) when zero.
	CounterRefreshInterval time.Duration
	// Shares, when set, makes the replicas share every budget: a
	// ShareReporter on every replica, a ShareAllocator on the leader. The
	// engine must then be a ShareEngine.
	Shares *ShareOptions

	// The following are used for testing purposes.

	// Clock is every piece's clock; the real one when nil.
	Clock clock.Clock
}

// ShareOptions configure the share exchange (see ShareReporter).
type ShareOptions struct {
	// Namespace holds the Leases; required.
	Namespace string
	// Replicas is how many replicas are expected, for the even split
	// before the first reading of the Leases.
	Replicas int
	// Interval, LeaseDuration and MaxIdentities: DefaultShareInterval,
	// DefaultShareLeaseDuration and DefaultShareIdentities when zero.
	Interval, LeaseDuration time.Duration
	MaxIdentities           int
}

// Controllers are the pieces SetupWithManager added to the manager.
type Controllers struct {
	Policy *PolicyReconciler
	Ready  *ReadyReconciler
	Writer *ReplicaStatusWriter
	Pruner *ReplicaPruner
	// Bootstrap is nil when Options set no Bootstrap budgets.
	Bootstrap *BootstrapReconciler
	Events    *ThrottleEvents
	// Reporter and Allocator are nil without Options.Shares.
	Reporter  *ShareReporter
	Allocator *ShareAllocator
}

// SetupWithManager adds the WatchBudget controllers to mgr, feeding engine:
// the policy reconciler, the status writer and the throttle events on every
// replica, the Ready reconciler, the pruner and the bootstrap reconciler on
// the leader. It adds a
// readyz check named "watchbudgets" that passes once the first policy is
// loaded. The manager's scheme must know the WatchBudget types
// (v1alpha1.AddToScheme).
func SetupWithManager(mgr ctrl.Manager, engine Engine, opts Options) (*Controllers, error) {
	if engine == nil {
		return nil, errors.New("controllers: engine is required")
	}
	if opts.PodName == "" {
		return nil, errors.New("controllers: pod name is required")
	}
	if gvk := v1alpha1.GroupVersion.WithKind("WatchBudget"); !mgr.GetScheme().Recognizes(gvk) {
		return nil, fmt.Errorf("controllers: the manager's scheme does not know %s: call v1alpha1.AddToScheme", gvk)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	c := &Controllers{
		Policy: &PolicyReconciler{Reader: mgr.GetCache(), Engine: engine, Clock: opts.Clock},
		Ready:  &ReadyReconciler{Client: mgr.GetClient(), Clock: opts.Clock},
	}
	c.Writer = &ReplicaStatusWriter{
		Client: mgr.GetClient(), Reader: mgr.GetCache(), APIReader: mgr.GetAPIReader(), Engine: engine, Policy: c.Policy,
		Pod: opts.PodName, Namespace: opts.Namespace, Interval: opts.StatusInterval, CounterRefreshInterval: opts.CounterRefreshInterval, Clock: opts.Clock,
	}
	c.Pruner = &ReplicaPruner{
		Client: mgr.GetClient(), Reader: mgr.GetCache(), PodReader: mgr.GetAPIReader(),
		Namespace: opts.Namespace, Pod: opts.PodName, Interval: opts.PruneInterval, Clock: opts.Clock,
	}
	if err := c.Policy.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up policy reconciler: %w", err)
	}
	if err := c.Ready.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up ready reconciler: %w", err)
	}
	if len(opts.Bootstrap) > 0 {
		c.Bootstrap = &BootstrapReconciler{Client: mgr.GetClient(), Budgets: opts.Bootstrap, Install: opts.Namespace}
		if err := c.Bootstrap.SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("set up bootstrap reconciler: %w", err)
		}
	}
	if err := mgr.Add(c.Writer); err != nil {
		return nil, err
	}
	if err := mgr.Add(c.Pruner); err != nil {
		return nil, err
	}
	if t := opts.ThrottleEvents; t != nil {
		c.Events = t
		if err := mgr.Add(t); err != nil {
			return nil, err
		}
	}
	if so := opts.Shares; so != nil {
		se, ok := engine.(ShareEngine)
		if !ok {
			return nil, errors.New("controllers: sharing budgets needs an engine that reports demand and enforces shares")
		}
		if so.Namespace == "" {
			return nil, errors.New("controllers: sharing budgets needs a namespace for its Leases")
		}
		c.Reporter = &ShareReporter{
			Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Engine: se, Pod: opts.PodName, Namespace: so.Namespace,
			Replicas: so.Replicas, Interval: so.Interval, LeaseDuration: so.LeaseDuration, MaxIdentities: so.MaxIdentities, Clock: opts.Clock,
		}
		c.Allocator = &ShareAllocator{
			Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: so.Namespace, Pod: opts.PodName,
			Interval: so.Interval, LeaseDuration: so.LeaseDuration, MaxIdentities: so.MaxIdentities, Clock: opts.Clock,
		}
		if err := mgr.Add(c.Reporter); err != nil {
			return nil, err
		}
		if err := mgr.Add(c.Allocator); err != nil {
			return nil, err
		}
	}
	if err := mgr.AddReadyzCheck("watchbudgets", c.Policy.Check); err != nil {
		return nil, err
	}
	return c, nil
}
