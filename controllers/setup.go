package controllers

import (
	"errors"
	"fmt"
	"os"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/watchgate/watchgate/api/v1alpha1"
)

// Options configure the controllers.
type Options struct {
	// PodName is this replica's pod name: the key of its entries in
	// status.replicas and part of its field manager's name. In a cluster,
	// set it from the downward API (metadata.name); the host name (which is
	// the pod name in a pod) when empty.
	PodName string
	// Namespace is the namespace the replicas' pods run in (downward API
	// metadata.namespace). The leader prunes entries of pods missing from
	// it. Empty disables pruning (running outside a cluster).
	Namespace string
	// ThrottleEvents, when set, is started to record Events; its
	// OnThrottled must be the engine's ratelimit.Options.OnThrottled.
	ThrottleEvents *ThrottleEvents
	// StatusInterval is how often replicas write their status entries;
	// DefaultStatusInterval (15 s) when zero.
	StatusInterval time.Duration
	// PruneInterval is how often the leader prunes; DefaultPruneInterval
	// (1 min) when zero.
	PruneInterval time.Duration

	// The following are used for testing purposes.
	Clock clock.WithTicker
}

// Controllers are the pieces SetupWithManager added to the manager.
type Controllers struct {
	Policy *PolicyReconciler
	Ready  *ReadyReconciler
	Writer *ReplicaStatusWriter
	Pruner *ReplicaPruner
	Events *ThrottleEvents
}

// SetupWithManager adds the WatchBudget controllers to mgr, feeding engine:
// the policy reconciler, the status writer and the throttle events on every
// replica, the Ready reconciler and the pruner on the leader. It registers
// the WatchBudget types with the manager's scheme and a readyz check named
// "watchbudgets" that passes once the first policy is loaded.
func SetupWithManager(mgr ctrl.Manager, engine Engine, opts Options) (*Controllers, error) {
	if engine == nil {
		return nil, errors.New("controllers: engine is required")
	}
	if opts.PodName == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("controllers: no pod name and no host name: %w", err)
		}
		opts.PodName = host
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if err := v1alpha1.AddToScheme(mgr.GetScheme()); err != nil {
		return nil, err
	}
	c := &Controllers{
		Policy: &PolicyReconciler{Reader: mgr.GetCache(), Engine: engine, Clock: opts.Clock},
		Ready:  &ReadyReconciler{Client: mgr.GetClient(), Clock: opts.Clock},
	}
	c.Writer = &ReplicaStatusWriter{
		Client: mgr.GetClient(), Reader: mgr.GetCache(), Engine: engine, Policy: c.Policy,
		Pod: opts.PodName, Interval: opts.StatusInterval, Clock: opts.Clock,
	}
	c.Pruner = &ReplicaPruner{
		Client: mgr.GetClient(), Reader: mgr.GetCache(), PodReader: mgr.GetAPIReader(),
		Namespace: opts.Namespace, Interval: opts.PruneInterval, Clock: opts.Clock,
	}
	if err := c.Policy.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up policy reconciler: %w", err)
	}
	if err := c.Ready.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up ready reconciler: %w", err)
	}
	if err := mgr.Add(c.Writer); err != nil {
		return nil, err
	}
	if err := mgr.Add(c.Pruner); err != nil {
		return nil, err
	}
	if t := opts.ThrottleEvents; t != nil {
		t.reader = mgr.GetCache()
		t.recorder = mgr.GetEventRecorder("watchgate")
		c.Events = t
		if err := mgr.Add(t); err != nil {
			return nil, err
		}
	}
	if err := mgr.AddReadyzCheck("watchbudgets", c.Policy.Check); err != nil {
		return nil, err
	}
	return c, nil
}
