package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Path is where every replica's proxy serves the TopReport. kube-apiserver
// serves nothing under "/.watchgate/", so the proxy answers every path
// under it itself and forwards none.
const Path = "/.watchgate/v1alpha1/top"

// PathPrefix is the prefix of the paths the proxy keeps to itself.
const PathPrefix = "/.watchgate/"

// Kind and APIVersion name the document.
const (
	Kind       = "TopReport"
	APIVersion = "watchgate.io/v1alpha1"
)

// The query parameters of Path.
const (
	// ParamBudget names the one budget to list; absent: every budget.
	ParamBudget = "budget"
	// ParamSort is the Sort to rank by; absent: SortRejections.
	ParamSort = "sort"
	// ParamLimit is how many identities to list per budget; absent:
	// DefaultLimit, at most MaxLimit.
	ParamLimit = "limit"
)

// DefaultLimit and MaxLimit bound the identities listed per budget.
const (
	DefaultLimit = 10
	MaxLimit     = 100
)

// Sort is the figure identities are ranked by.
type Sort string

// The Sorts: by rejections, by watch opens, by open watches.
const (
	SortRejections Sort = "rejections"
	SortOpens      Sort = "opens"
	SortWatches    Sort = "watches"
)

// Sorts are the valid Sorts.
var Sorts = []Sort{SortRejections, SortOpens, SortWatches}

// TopReport is one replica's ranking of the identities its budgets track.
type TopReport struct {
	metav1.TypeMeta `json:",inline"`
	// Replica is the name of the replica that answered (its pod).
	Replica string `json:"replica"`
	// Sort is the figure the identities are ranked by, most first.
	Sort Sort `json:"sort"`
	// Limit is the most identities listed per budget.
	Limit int `json:"limit"`
	// Budgets are the budgets asked for, by name.
	Budgets []BudgetTop `json:"budgets"`
}

// BudgetTop is one budget's ranked identities on one replica.
type BudgetTop struct {
	// Name is the WatchBudget's name.
	Name string `json:"name"`
	// Identities are at most Limit identities whose figure is not zero.
	Identities []IdentityFigures `json:"identities"`
}

// IdentityFigures are one identity's figures under one budget on one
// replica, since the replica began tracking it (idle identities are
// forgotten after a while).
type IdentityFigures struct {
	// User is the user name the budget charges (cut, with a hash
	// appended, beyond 512 bytes).
	User string `json:"user"`
	// Rejections counts its requests refused (in DryRun: that would
	// have been).
	Rejections int64 `json:"rejections"`
	// Opens counts the watches it was admitted.
	Opens int64 `json:"opens"`
	// Watches is the number of its watches open now.
	Watches int64 `json:"watches"`
}
