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
// replica writes its own entry in replicas, and moves its sketch into
// observedByGoneReplicas when it removes the entry.
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

	// suggested are the limits that would have admitted the observed peaks
	// of spec.suggestion.share percent of the identities the budget
	// governed, times spec.suggestion.headroomPercent percent, and how many
	// identities the current limits refused or would have; written by the
	// leader from the replicas' observed peaks and observedByGoneReplicas. Absent until a replica has
	// observed an identity, and for an Exempt or invalid budget.
	// +optional
	Suggested *SuggestedLimits `json:"suggested,omitempty"`

	// observedByGoneReplicas adds up the sketches of the replicas whose
	// entries are gone: a replica that stops adds its sketch here as it
	// removes its entry, and the leader adds the sketch of an entry it
	// prunes, in the same patch. So the suggestion outlives the pods: a
	// rollout (the helm upgrade that switches a budget to Enforce, say), a
	// drained node or a crash leaves it resting on everything observed
	// since its since. An identity seen before and after a restart counts
	// twice. To start the observation over, restart the replicas, then
	// remove it (kubectl patch --subresource=status).
	// +optional
	ObservedByGoneReplicas *ObservedPeaks `json:"observedByGoneReplicas,omitempty"`

	// replicas holds one entry per proxy replica, keyed by pod name, each
	// written by that replica alone (server-side apply, one field manager
	// per replica) at most every 15 seconds and only when its figures
	// change; a change of decisions alone waits up to 5 minutes. Entries of
	// replicas whose pod is gone are pruned by the leader of their
	// namespace. At most 256.
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

	// namespace is the namespace of the replica's pod: only the leader of
	// the install in that namespace prunes the entry, so that installs in
	// other namespaces sharing the CRD keep theirs. Empty for a replica
	// that runs outside a cluster. At most 63 characters.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Namespace string `json:"namespace,omitempty"`

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

	// observed sketches the peaks of the identities this replica observed
	// under the budget (counts of identities by peak, never who they are),
	// from which the leader suggests limits. Absent for an Exempt budget.
	// +optional
	Observed *ObservedPeaks `json:"observed,omitempty"`

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

// SuggestedLimits are limits suggested from what the identities a budget
// governs did, with what they rest on. Each limit is the observed peak
// that share percent of the identities stayed within (rounded up by less
// than an eighth), times headroomPercent percent, between 1 and 100000.
type SuggestedLimits struct {
	// summary is the suggestion as `kubectl get wb -o wide` shows it:
	// "60/min b10 w40" for watchOpensPerMinute, watchBurst and
	// maxConcurrentWatches, then " l20/min" for listsPerMinute when the
	// budget limits lists; "-" for a limit with nothing observed. At most
	// 64 characters.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Summary string `json:"summary,omitempty"`

	// watchOpensPerMinute would have admitted the most watch opens in a
	// calendar minute of share percent of the identities that opened
	// watches. Absent when none did. Between 0 and 100000.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	WatchOpensPerMinute int32 `json:"watchOpensPerMinute,omitempty"`

	// watchBurst would have admitted the most watch opens in a calendar
	// second of share percent of them, and is at least
	// spec.limits.initialStateCost. Absent when none opened a watch.
	// Between 0 and 100000.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	WatchBurst int32 `json:"watchBurst,omitempty"`

	// maxConcurrentWatches would have admitted the most watches open at
	// once through one replica of share percent of them (see identities). Absent when none
	// opened a watch. Between 0 and 100000.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	MaxConcurrentWatches int32 `json:"maxConcurrentWatches,omitempty"`

	// listsPerMinute would have admitted the most lists in a calendar
	// minute of share percent of the identities that listed; only when
	// spec.limits.listsPerMinute is set. Between 0 and 100000.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	ListsPerMinute int32 `json:"listsPerMinute,omitempty"`

	// wouldRefuse is how many of the observed identities the budget
	// refused, or in DryRun would have: those whose peak certainly
	// exceeds what a current limit admits (opens in a minute above
	// watchOpensPerMinute + watchBurst, in a second above watchBurst +
	// watchOpensPerMinute/60, watches at once above maxConcurrentWatches,
	// lists in a minute above listsPerMinute + listBurst), those held back
	// by backoff (a watch refused as BackingOff), and, while
	// staleVersions.action is Reject, those answered "too old" locally
	// (stale loops). It is the most that any one of these refuses: a
	// lower bound.
	// +kubebuilder:validation:Minimum=0
	// +optional
	WouldRefuse int64 `json:"wouldRefuse"`

	// refusedAnyway is how many of the observed identities were refused,
	// or in DryRun would have been, for what no limit changes: those held
	// back by backoff (their watches kept failing) plus, while
	// staleVersions.action is Reject, those answered "too old" locally
	// (an identity refused for both counts twice). The suggested limits
	// refuse them too; the others they would have admitted but for the
	// share of identities spec.suggestion.share leaves out.
	// +kubebuilder:validation:Minimum=0
	// +optional
	RefusedAnyway int64 `json:"refusedAnyway"`

	// identities is how many identities the suggestion rests on, summed
	// over the replicas: an identity served by two replicas counts twice,
	// each time with the peaks of its requests through that replica, and
	// one forgotten when idle and seen again later counts again. The
	// peaks are per replica; the limits are per replica only when each
	// replica enforces every budget whole (--share-budgets=false, or no
	// leader election). Shared budgets (the default with leader election)
	// bound an identity's requests through all replicas together, so for
	// an identity spread over replicas the suggestion rests on parts of
	// its traffic and may fall short of its sum; with ClientIP affinity an
	// identity's clients stay on one replica.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Identities int64 `json:"identities"`

	// since is when the observation began: the earliest time a replica
	// whose sketch counts (in its entry or in observedByGoneReplicas)
	// started observing the budget (its start, or the budget's creation).
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
}

// ObservedPeaks sketch, for one budget on one replica (or on the replicas
// that are gone), the peaks of the identities it governed: for each
// quantity, how many identities had their peak in each of fixed log-scale
// buckets. Buckets are the same on every
// replica, so the leader merges sketches by adding counts.
type ObservedPeaks struct {
	// since is when this replica (the earliest of the replicas) started
	// observing the budget.
	// +required
	Since metav1.Time `json:"since"`

	// identities is how many identities this replica (or these replicas)
	// observed; each counts once in every list below (with a peak of 0 in what it never did).
	// +kubebuilder:validation:Minimum=0
	// +optional
	Identities int64 `json:"identities"`

	// watchOpensPerMinute: identities by their most watch opens in a
	// calendar minute (UTC). At most 120 buckets.
	// +kubebuilder:validation:MaxItems=120
	// +listType=atomic
	// +optional
	WatchOpensPerMinute []PeakBucket `json:"watchOpensPerMinute,omitempty"`

	// watchBurst: identities by their most watch opens in a calendar
	// second. At most 120 buckets.
	// +kubebuilder:validation:MaxItems=120
	// +listType=atomic
	// +optional
	WatchBurst []PeakBucket `json:"watchBurst,omitempty"`

	// concurrentWatches: identities by their most watches open at once
	// (counting one refused for too many). At most 120 buckets.
	// +kubebuilder:validation:MaxItems=120
	// +listType=atomic
	// +optional
	ConcurrentWatches []PeakBucket `json:"concurrentWatches,omitempty"`

	// listsPerMinute: identities by their most lists in a calendar minute.
	// At most 120 buckets.
	// +kubebuilder:validation:MaxItems=120
	// +listType=atomic
	// +optional
	ListsPerMinute []PeakBucket `json:"listsPerMinute,omitempty"`

	// staleAnswersPerMinute: identities by their most watches answered
	// "too old" in a calendar minute: stale loops. At most 120 buckets.
	// +kubebuilder:validation:MaxItems=120
	// +listType=atomic
	// +optional
	StaleAnswersPerMinute []PeakBucket `json:"staleAnswersPerMinute,omitempty"`

	// backoffRefusalsPerMinute: identities by their most watches refused
	// (or, in DryRun, that would have been) for backoff in a calendar
	// minute. At most 120 buckets.
	// +kubebuilder:validation:MaxItems=120
	// +listType=atomic
	// +optional
	BackoffRefusalsPerMinute []PeakBucket `json:"backoffRefusalsPerMinute,omitempty"`
}

// PeakBucket is one bucket of a sketch: how many identities had a peak
// at or below le and above the previous bucket's le.
type PeakBucket struct {
	// le is the bucket's upper bound: 0 to 15 exactly, then eight buckets
	// per power of two (17, 19, ... 31, 35, ... 63, 71, ...), up to 131071,
	// which also counts larger peaks.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=131071
	// +required
	Le int32 `json:"le"`

	// count is the number of identities in the bucket.
	// +kubebuilder:validation:Minimum=0
	// +required
	Count int64 `json:"count"`
}
