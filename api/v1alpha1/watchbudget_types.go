package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WatchBudget is a per-identity budget of watches (and, optionally, lists)
// that the watchgate proxy enforces in front of kube-apiserver. Each request
// the proxy budgets is governed by exactly one WatchBudget: among those whose
// subjects and resources match, the lowest precedence wins, ties broken by
// name (like API Priority and Fairness's FlowSchemas). A request no budget
// matches is not limited.
//
// Limits are per identity: every user a budget governs gets its own token
// buckets, its own cap on concurrent watches and its own backoff. Editing a
// budget keeps every identity's accrued state; deleting it frees its
// buckets and backoff. An open watch counts against the budget that
// governs it now: when a budget is deleted and created again, or another
// budget takes an identity over, the watches it holds open count there.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=wb,categories=watchgate
// +kubebuilder:printcolumn:name="Enforcement",type=string,JSONPath=`.spec.enforcement`,description="What the budget does with requests over budget: Enforce, DryRun or Exempt."
// +kubebuilder:printcolumn:name="Requests",type=string,JSONPath=`.spec.impersonation`,description="Which requests the budget matches: Any, Impersonated (the users behind an agent) or Direct (callers in their own name)."
// +kubebuilder:printcolumn:name="Opens/min",type=string,JSONPath=`.status.limits.watchOpensPerMinute`,description="Watch opens per minute per identity (0: unlimited; -: Exempt ignores it)."
// +kubebuilder:printcolumn:name="Burst",type=string,JSONPath=`.status.limits.watchBurst`,description="Watch opens an identity may make at once (-: Exempt ignores it)."
// +kubebuilder:printcolumn:name="Max watches",type=string,JSONPath=`.status.limits.maxConcurrentWatches`,description="Watches an identity may hold open at once (0: no cap; -: Exempt ignores it)."
// +kubebuilder:printcolumn:name="Aggregate",type=string,JSONPath=`.status.limits.aggregateMaxConcurrentWatches`,description="Watches each caller may hold open for the users it impersonates, in sum (empty: no cap; -: Exempt ignores it)."
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.activeWatches`,description="Watches open right now, over all proxy replicas."
// +kubebuilder:printcolumn:name="Rejections",type=integer,JSONPath=`.status.recentRejections`,description="Requests rejected (or, in DryRun, that would have been) in the last 5 minutes, over all proxy replicas."
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="Whether the budget is valid and enforced."
// +kubebuilder:printcolumn:name="Precedence",type=integer,JSONPath=`.spec.precedence`,priority=1,description="Lowest matching precedence governs a request."
// +kubebuilder:printcolumn:name="Suggested",type=string,JSONPath=`.status.suggested.summary`,priority=1,description="Limits that would have admitted most identities' observed peaks, with headroom: opens/min, burst (b), concurrent watches (w), lists/min (l). See status.suggested."
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type WatchBudget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is what the budget governs and how.
	// +optional
	Spec WatchBudgetSpec `json:"spec,omitempty"`

	// status is written by watchgate: whether the budget is valid and
	// enforced (conditions), and live figures from each proxy replica.
	// +optional
	Status WatchBudgetStatus `json:"status,omitempty"`
}

// WatchBudgetList is a list of WatchBudgets.
//
// +kubebuilder:object:root=true
type WatchBudgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WatchBudget `json:"items"`
}
