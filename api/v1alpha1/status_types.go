package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConditionReady is the condition type that says whether a budget is valid
// and part of the policy the proxy enforces.
const ConditionReady = "Ready"

// Reasons of the Ready condition.
const (
	// ReasonCompiled: the budget is valid and part of the policy.
	ReasonCompiled = "Compiled"
	// ReasonInvalidSpec: the budget is invalid and ignored; the message says
	// why. The other budgets are not affected.
	ReasonInvalidSpec = "InvalidSpec"
)

// WatchBudgetStatus is written by watchgate. The conditions and the sums
// (activeWatches, recentRejections) are written by the leader; each proxy
// replica writes its own entry in replicas.
type WatchBudgetStatus struct {
	// conditions: Ready is True when the budget is valid and enforced (reason
	// Compiled), False when it is invalid and ignored (reason InvalidSpec,
	// the message says why); its observedGeneration is the generation it
	// describes.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// activeWatches is the number of watches this budget governs that are
	// open right now, summed over the replicas' entries.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ActiveWatches int64 `json:"activeWatches"`

	// recentRejections is the number of requests this budget rejected (or,
	// in DryRun, would have rejected) in the last 5 minutes, summed over the
	// replicas' entries.
	// +kubebuilder:validation:Minimum=0
	// +optional
	RecentRejections int64 `json:"recentRejections"`

	// limits are spec.limits as `kubectl get` shows them, written by the
	// leader: "-" for each when the budget is Exempt, which ignores them.
	// +optional
	Limits *ShownLimits `json:"limits,omitempty"`

	// replicas holds one entry per proxy replica, keyed by pod name, each
	// written by that replica alone (server-side apply, one field manager
	// per replica) at most every 15 seconds and only when its figures
	// change; a change of decisions alone waits up to 5 minutes. Entries of
	// replicas whose pod is gone are pruned. At most 256.
	// +listType=map
	// +listMapKey=pod
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Replicas []ReplicaStatus `json:"replicas,omitempty"`
}

// ShownLimits are a budget's limits as text for `kubectl get`'s columns:
// the number from spec.limits, or "-" when the budget ignores it.
type ShownLimits struct {
	// watchOpensPerMinute is spec.limits.watchOpensPerMinute, or "-".
	// +kubebuilder:validation:MaxLength=16
	// +optional
	WatchOpensPerMinute string `json:"watchOpensPerMinute,omitempty"`

	// watchBurst is spec.limits.watchBurst, or "-".
	// +kubebuilder:validation:MaxLength=16
	// +optional
	WatchBurst string `json:"watchBurst,omitempty"`

	// maxConcurrentWatches is spec.limits.maxConcurrentWatches, or "-".
	// +kubebuilder:validation:MaxLength=16
	// +optional
	MaxConcurrentWatches string `json:"maxConcurrentWatches,omitempty"`

	// aggregateMaxConcurrentWatches is spec.aggregate.maxConcurrentWatches,
	// or "-".
	// +kubebuilder:validation:MaxLength=16
	// +optional
	AggregateMaxConcurrentWatches string `json:"aggregateMaxConcurrentWatches,omitempty"`
}

// ReplicaStatus is one proxy replica's live view of a budget.
type ReplicaStatus struct {
	// pod is the name of the replica's pod. Required; 1 to 253 characters.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Pod string `json:"pod"`

	// observedGeneration is the budget generation this replica enforces.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ObservedGeneration int64 `json:"observedGeneration"`

	// activeWatches is the number of watches governed by this budget open
	// through this replica right now.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ActiveWatches int64 `json:"activeWatches"`

	// trackedIdentities is the number of identities this replica holds
	// state (buckets, open watches, backoff) for under this budget.
	// +kubebuilder:validation:Minimum=0
	// +optional
	TrackedIdentities int64 `json:"trackedIdentities"`

	// decisions counts this replica's decisions since it started, by reason:
	// Allowed, RateLimited, TooManyWatches, BackingOff,
	// StaleResourceVersion. In DryRun the rejection reasons count requests
	// that were admitted but would have been rejected. Every admitted request
	// adds to them, so a change of these counts alone is written at most
	// every 5 minutes (the other figures at once). At most 16 keys.
	// +kubebuilder:validation:MaxProperties=16
	// +optional
	Decisions map[string]int64 `json:"decisions,omitempty"`

	// recentRejections is the number of requests this replica rejected (or
	// would have, in DryRun) in the last 5 minutes.
	// +kubebuilder:validation:Minimum=0
	// +optional
	RecentRejections int64 `json:"recentRejections"`

	// topOffenders are the identities with the most rejections on this
	// replica since it started, most first. At most 5.
	// +kubebuilder:validation:MaxItems=5
	// +listType=atomic
	// +optional
	TopOffenders []Offender `json:"topOffenders,omitempty"`

	// lastUpdateTime is when this replica last wrote its entry.
	// +required
	LastUpdateTime metav1.Time `json:"lastUpdateTime"`
}

// Offender is an identity that has been rejected.
type Offender struct {
	// user is the identity's user name. Required; at most 1024 characters.
	// +kubebuilder:validation:MaxLength=1024
	// +required
	User string `json:"user"`

	// rejections is the number of the identity's requests rejected (or, in
	// DryRun, that would have been) on this replica since it started.
	// +kubebuilder:validation:Minimum=0
	// +required
	Rejections int64 `json:"rejections"`
}
