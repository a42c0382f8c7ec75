package ratelimit

import "time"

// Policy is an immutable, compiled set of budgets: what an Engine enforces.
// Build one with NewPolicy and hand it to Engine.SetPolicy; a Policy may be
// shared by several engines and read by any number of goroutines.
type Policy struct {
	// budgets are deep copies with defaults filled in, in match order:
	// precedence ascending, then name.
	budgets []Budget
	// matchers[i] is budgets[i] compiled for matching: what matchRequest
	// reads, together, in place of the much larger Budget.
	matchers []budgetMatcher
	// longestStaleMemory bounds how long the engine keeps a stale version.
	longestStaleMemory time.Duration
}

// Enforcement says what a budget does with its decisions.
type Enforcement string

const (
	// Enforce rejects requests over budget.
	Enforce Enforcement = "Enforce"
	// DryRun decides, counts and logs like Enforce, but always allows.
	DryRun Enforcement = "DryRun"
	// Exempt admits everything the budget matches without tracking it, like
	// API Priority and Fairness's exempt priority level (for system:masters,
	// controllers that must never wait).
	Exempt Enforcement = "Exempt"
)

// StaleAction says what happens to a watch that asks for a resourceVersion
// the API server already answered "too old" for.
type StaleAction string

const (
	// StaleReject answers the watch locally (410 Expired) without asking the
	// API server.
	StaleReject StaleAction = "Reject"
	// StalePass forwards it anyway.
	StalePass StaleAction = "Pass"
)

// Impersonation is which requests a Budget matches by how they name their
// identity (Request.Impersonated).
type Impersonation string

const (
	// AnyRequest matches every request; the zero value means the same.
	AnyRequest Impersonation = "Any"
	// ImpersonatedOnly matches only requests charged to an impersonated
	// identity.
	ImpersonatedOnly Impersonation = "Impersonated"
	// DirectOnly matches only requests charged to the caller itself.
	DirectOnly Impersonation = "Direct"
)

// SubjectKind is the kind of identity a Subject matches.
type SubjectKind string

const (
	// User matches the authenticated (or impersonated) user name.
	User SubjectKind = "User"
	// Group matches any of the identity's groups.
	Group SubjectKind = "Group"
	// ServiceAccount matches system:serviceaccount:<namespace>:<name>.
	ServiceAccount SubjectKind = "ServiceAccount"
)

// Subject selects identities. Name (and Namespace for service accounts) is
// exact, or a prefix when it ends in '*'; "*" alone matches everything.
type Subject struct {
	Kind      SubjectKind
	Name      string
	Namespace string // ServiceAccount only
}

// ResourceRule selects requests by API group, resource and namespace: a
// request matches when all three lists match. An empty list, or one holding
// "*", matches everything; an entry ending in '*' is a prefix ("team-*").
// The core group is "". Namespaces: "" in the list matches cluster-scoped
// and all-namespace requests, which no other entry but "*" matches.
type ResourceRule struct {
	APIGroups  []string
	Resources  []string
	Namespaces []string
}

// Limits are per identity: every identity a budget governs gets its own
// buckets and its own cap.
type Limits struct {
	// WatchOpensPerMinute refills the watch bucket; 0 means unlimited opens.
	WatchOpensPerMinute int32
	// WatchBurst is the watch bucket's size; at least 1 when opens are
	// limited.
	WatchBurst int32
	// MaxConcurrentWatches caps watches open at once; 0 means no cap.
	MaxConcurrentWatches int32
	// InitialStateCost is the number of tokens a watch that asks for initial
	// state (no resourceVersion, "0", or sendInitialEvents=true) takes, since
	// it costs the server a LIST; 0 is taken as 1. At most WatchBurst, or
	// such a watch could never be admitted.
	InitialStateCost int32
	// ListsPerMinute refills the list bucket; 0 means lists are not budgeted.
	ListsPerMinute int32
	// ListBurst is the list bucket's size; at least 1 when lists are
	// budgeted.
	ListBurst int32
	// ListsPerMinutePerResource refills each of the identity's rebuild
	// buckets, one per (group, resource); 0 means rebuilds are not limited
	// per resource. A rebuild is a LIST's first page or a watch that asks
	// for initial state (see resourcelists.go); it takes one token of its
	// resource's bucket besides what the list or watch bucket takes.
	ListsPerMinutePerResource int32
	// ListBurstPerResource is the size of each rebuild bucket; at least 1
	// when ListsPerMinutePerResource is set.
	ListBurstPerResource int32
}

// Backoff configures the per-watch-key exponential backoff (key: identity ×
// group/resource × namespace × label and field selectors). A zero Initial
// disables it. The delay after the n-th consecutive failure is
// min(Max, Initial·2^(n-1)), of which the last 20% is jitter, never below
// Initial; see Engine.WatchEnded.
type Backoff struct {
	// Initial is the delay after the first failure.
	Initial time.Duration
	// Max caps the delay; at least Initial.
	Max time.Duration
	// ShortWatch: a watch that ends sooner than this, or with an error, is a
	// failure.
	ShortWatch time.Duration
	// ResetAfter: a watch that lived at least this long clears the key's
	// backoff, however it ended. 0 means any watch that is not a failure
	// clears it.
	ResetAfter time.Duration
}

// StaleMatch says which resourceVersions a report of "too old" makes
// stale.
//
// Versions are compared as kube-apiserver parses them
// (storage.APIObjectVersioner.ParseResourceVersion: strconv.ParseUint, base
// 10, 64 bits), so "000100" is 100. A version that does not parse, "" and
// "0" are never stale: the API server answers such watches itself.
type StaleMatch string

const (
	// StaleMatchExact makes only the very version the API server called
	// too old stale.
	StaleMatchExact StaleMatch = "Exact"
	// StaleMatchAtOrBelow makes every version at or below it stale too,
	// for its (group, resource): a "too old" watermark. It rests on how
	// kube-apiserver backs its versions: etcd revisions, integers that only
	// grow, whose window of history (and the watch cache's) only moves
	// forward, so a version below one the server already called too old is
	// too old as well, and a storm of clients each holding its own stale
	// version costs one upstream watch, not one per version. Where that
	// does not hold — several API servers with different windows behind
	// one address, an etcd restored from backup — a version one of them
	// still holds may be refused: the client relists once, as it would
	// after a real 410. The default.
	StaleMatchAtOrBelow StaleMatch = "AtOrBelow"
)

// StaleVersions configures the stale-resourceVersion memory.
type StaleVersions struct {
	// Action is StaleReject when empty.
	Action StaleAction
	// Match is StaleMatchAtOrBelow when empty.
	Match StaleMatch
	// Memory is how long a report of "too old" counts: a version is stale
	// while a report that makes it so (see Match) is younger than Memory;
	// 0 disables the memory for this budget (every watch goes to the
	// server).
	Memory time.Duration
}

// Budget is one compiled WatchBudget.
type Budget struct {
	// Name identifies the budget (the WatchBudget's name); unique in a Policy.
	Name string
	// Precedence orders budgets: the lowest number that matches governs the
	// request; ties are broken by Name.
	Precedence int32
	// Subjects the budget governs; empty means every authenticated identity.
	Subjects []Subject
	// Resources the budget governs; empty means all.
	Resources []ResourceRule
	// Impersonation narrows the budget to impersonated or direct requests;
	// AnyRequest when empty.
	Impersonation Impersonation
	// Enforcement is Enforce when empty.
	Enforcement Enforcement
	Limits      Limits
	// Aggregate bounds the sum of what a caller this budget governs opens
	// while impersonating others (see Aggregate); the zero value bounds
	// nothing.
	Aggregate     Aggregate
	Backoff       Backoff
	StaleVersions StaleVersions
	// Suggestion says which limits to suggest from the identities'
	// observed peaks (see Suggest); it changes no decision.
	Suggestion Suggestion
}
