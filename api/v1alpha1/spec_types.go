package v1alpha1

// WatchBudgetSpec says which requests a budget governs (subjects ×
// resources), how it ranks against other budgets (precedence), and what it
// does with them (enforcement, limits, backoff, staleVersions).
type WatchBudgetSpec struct {
	// precedence orders budgets: of all budgets that match a request, the one
	// with the lowest precedence governs it; ties are broken by name. Use low
	// numbers for narrow budgets (an exemption, one dashboard) and high
	// numbers for catch-alls. Between 1 and 10000; default 1000.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +kubebuilder:default=1000
	// +optional
	Precedence int32 `json:"precedence,omitempty"`

	// subjects are the identities the budget governs; a request matches when
	// any subject matches its user (the impersonated user when the caller is
	// allowed to impersonate). Empty means every authenticated identity. At
	// most 64.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Subjects []Subject `json:"subjects,omitempty"`

	// impersonation narrows the budget by how a request names its
	// identity. Any (default) matches every request. Impersonated matches
	// only requests whose caller may impersonate and does (Impersonate-User
	// honoured): the people behind an agent, each charged in their own
	// name. Direct matches only requests in the caller's own name: an
	// agent's own informers, kubectl with a user's token. The chart's
	// default budgets use it so that routing an agent governs the users it
	// serves without throttling the agent's own start-up watches.
	// +kubebuilder:validation:Enum=Any;Impersonated;Direct
	// +kubebuilder:default=Any
	// +optional
	Impersonation Impersonation `json:"impersonation,omitempty"`

	// resources are the API groups, resources and namespaces the budget
	// governs; a request matches when any rule matches. Empty means all. At
	// most 32.
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	Resources []ResourceRule `json:"resources,omitempty"`

	// enforcement is what the budget does with the requests it governs.
	// Enforce rejects requests over budget (HTTP 429 with Retry-After, or a
	// local "too old" answer for a stale resourceVersion). DryRun decides,
	// counts, logs and emits events exactly like Enforce but admits
	// everything: use it to size limits before enforcing them. Exempt admits
	// everything without tracking it, and limits, backoff and staleVersions
	// are ignored: use it, with a low precedence, for identities that must
	// never wait (system:masters, core controllers). Default Enforce.
	// +kubebuilder:validation:Enum=Enforce;DryRun;Exempt
	// +kubebuilder:default=Enforce
	// +optional
	Enforcement Enforcement `json:"enforcement,omitempty"`

	// limits are per identity: each identity the budget governs gets its own
	// buckets and its own cap.
	// +kubebuilder:default={}
	// +optional
	Limits Limits `json:"limits,omitempty"`
	// aggregate makes the budget hierarchical: it bounds the sum of the
	// watches each caller the budget governs opens while impersonating
	// others. Every impersonated watch is charged to the impersonated
	// user's own budget (its buckets and cap) and to the aggregate of the
	// caller, the one whose credentials the request carries: the budget
	// that governs the caller's own requests for that resource. So made-up
	// impersonated names, each a fresh identity, cannot multiply what one
	// caller may open. Unset: no aggregate. Ignored when enforcement is
	// Exempt; in DryRun, reported but not enforced.
	// +optional
	Aggregate *Aggregate `json:"aggregate,omitempty"`

	// backoff slows down clients whose watches keep dying: after a failed
	// watch (one that ended with an error, or sooner than shortWatchSeconds)
	// the next watch of the same identity, resource, namespace and selectors
	// waits initialDelaySeconds, doubling (with jitter) up to
	// maxDelaySeconds.
	// +kubebuilder:default={}
	// +optional
	Backoff Backoff `json:"backoff,omitempty"`

	// staleVersions is what happens to a watch that resubscribes with a
	// resourceVersion the API server has already answered "too old" (410
	// Expired) for.
	// +kubebuilder:default={}
	// +optional
	StaleVersions StaleVersions `json:"staleVersions,omitempty"`

	// suggestion says which limits watchgate suggests in status.suggested
	// from what the identities the budget governs did (DryRun included):
	// those that would have admitted the observed peaks of share percent
	// of the identities, times headroomPercent percent. It changes no
	// decision.
	// +kubebuilder:default={}
	// +optional
	Suggestion Suggestion `json:"suggestion,omitempty"`
}

// Suggestion says which limits to suggest from the identities' observed
// peaks.
type Suggestion struct {
	// share is the percentage of identities whose observed peaks the
	// suggested limits would have admitted; the busiest identities beyond
	// it are left out, so that one runaway client does not set everyone's
	// limits. Each limit counts only the identities that did what it limits
	// (opened a watch, listed). Between 1 and 100; default 95.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +kubebuilder:default=95
	// +optional
	Share *int32 `json:"share,omitempty"`

	// headroomPercent multiplies the observed peaks, in percent, for the
	// suggested limits: 150 suggests half again what was observed. Between
	// 100 and 1000; default 150.
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=150
	// +optional
	HeadroomPercent *int32 `json:"headroomPercent,omitempty"`
}

// Enforcement is what a budget does with the requests it governs: Enforce,
// DryRun or Exempt.
type Enforcement string

const (
	// EnforcementEnforce rejects requests over budget.
	EnforcementEnforce Enforcement = "Enforce"
	// EnforcementDryRun decides and reports like Enforce but admits
	// everything.
	EnforcementDryRun Enforcement = "DryRun"
	// EnforcementExempt admits everything without tracking it.
	EnforcementExempt Enforcement = "Exempt"
)

// Impersonation is which requests a budget matches by how they name their
// identity: Any, Impersonated or Direct.
type Impersonation string

const (
	// ImpersonationAny matches every request.
	ImpersonationAny Impersonation = "Any"
	// ImpersonationImpersonated matches only requests with honoured
	// impersonation headers.
	ImpersonationImpersonated Impersonation = "Impersonated"
	// ImpersonationDirect matches only requests without them.
	ImpersonationDirect Impersonation = "Direct"
)

// SubjectKind is the kind of identity a Subject matches: User, Group or
// ServiceAccount.
type SubjectKind string

const (
	// SubjectKindUser matches the user name.
	SubjectKindUser SubjectKind = "User"
	// SubjectKindGroup matches any of the identity's groups.
	SubjectKindGroup SubjectKind = "Group"
	// SubjectKindServiceAccount matches the user
	// system:serviceaccount:<namespace>:<name>.
	SubjectKindServiceAccount SubjectKind = "ServiceAccount"
)

// Subject selects identities by user name, group or service account.
//
// +kubebuilder:validation:XValidation:rule="self.kind == 'ServiceAccount' ? has(self.namespace) : !has(self.namespace)",message="namespace is required for kind ServiceAccount and not allowed for kinds User and Group"
type Subject struct {
	// kind is User (matches the user name), Group (matches any of the
	// identity's groups) or ServiceAccount (matches the user
	// system:serviceaccount:<namespace>:<name>). Required.
	// +kubebuilder:validation:Enum=User;Group;ServiceAccount
	// +required
	Kind SubjectKind `json:"kind"`

	// name is the user, group or service account name: exact, or a prefix
	// when it ends in '*' ("*" alone matches every name; "dashboard-*"
	// matches dashboard-alice). '*' is allowed only as the last character.
	// Required; 1 to 253 characters.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[^*]*\*?$`
	// +required
	Name string `json:"name"`

	// namespace is the service account's namespace: exact, or a prefix when
	// it ends in '*' ("*" matches every namespace). Required for kind
	// ServiceAccount, not allowed otherwise; 1 to 64 characters.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[-a-z0-9]*\*?$`
	// +optional
	Namespace string `json:"namespace,omitempty"`
}

// ResourceRule selects requests by API group, resource and namespace; a
// request matches when it matches all three lists. An empty list, or one
// holding "*", matches everything.
type ResourceRule struct {
	// apiGroups are API groups; "" is the core group (pods, configmaps...).
	// Empty or "*" matches every group; an entry ending in '*' is a prefix
	// ('*' only last). At most 32 entries of at most 253 characters.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[^*]*\*?$`
	// +listType=atomic
	// +optional
	APIGroups []string `json:"apiGroups,omitempty"`

	// resources are resource names in the plural, lower case, as in URLs
	// ("pods", "deployments"). Empty or "*" matches every resource; an entry
	// ending in '*' is a prefix ('*' only last). At most 64 entries of 1 to
	// 253 characters.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[^*]*\*?$`
	// +listType=atomic
	// +optional
	Resources []string `json:"resources,omitempty"`

	// namespaces are the namespaces of namespaced requests; "" matches
	// requests for cluster-scoped resources and requests across all
	// namespaces. Empty or "*" matches every namespace; an entry ending in
	// '*' is a prefix ("team-*"; '*' only last). At most 64 entries of at
	// most 63 characters.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[^*]*\*?$`
	// +listType=atomic
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
}

// Limits are per identity: every identity a budget governs gets its own
// token buckets and its own cap on concurrent watches.
//
// +kubebuilder:validation:XValidation:rule="!has(self.watchOpensPerMinute) || self.watchOpensPerMinute == 0 || (has(self.watchBurst) && self.watchBurst >= 1)",message="watchBurst must be at least 1 when watchOpensPerMinute is set",fieldPath=".watchBurst"
// +kubebuilder:validation:XValidation:rule="!has(self.watchOpensPerMinute) || self.watchOpensPerMinute == 0 || !has(self.watchBurst) || !has(self.initialStateCost) || self.initialStateCost <= self.watchBurst",message="initialStateCost must not exceed watchBurst, or a watch that asks for initial state could never be admitted",fieldPath=".initialStateCost"
// +kubebuilder:validation:XValidation:rule="!has(self.listsPerMinute) || self.listsPerMinute == 0 || (has(self.listBurst) && self.listBurst >= 1)",message="listBurst must be at least 1 when listsPerMinute is set",fieldPath=".listBurst"
// +kubebuilder:validation:XValidation:rule="!has(self.listsPerMinutePerResource) || self.listsPerMinutePerResource == 0 || (has(self.listBurstPerResource) && self.listBurstPerResource >= 1)",message="listBurstPerResource must be at least 1 when listsPerMinutePerResource is set",fieldPath=".listBurstPerResource"
type Limits struct {
	// watchOpensPerMinute is the rate, in watch opens per minute, at which an
	// identity's watch bucket refills; 0 means opens are not limited. Between
	// 0 and 100000; default 60.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=60
	// +optional
	WatchOpensPerMinute *int32 `json:"watchOpensPerMinute,omitempty"`

	// watchBurst is the size, in watch opens, of an identity's watch bucket:
	// how many watches it may open at once after being idle. Must be at least
	// 1 when watchOpensPerMinute is set. Between 0 and 100000; default 30.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=30
	// +optional
	WatchBurst *int32 `json:"watchBurst,omitempty"`

	// maxConcurrentWatches caps the watches an identity may hold open at
	// once; 0 means no cap. The replicas share it when budgets are shared
	// (--share-budgets, the default with leader election); otherwise each
	// replica applies it alone. Between 0 and 100000; default 0.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=0
	// +optional
	MaxConcurrentWatches *int32 `json:"maxConcurrentWatches,omitempty"`

	// initialStateCost is the number of tokens, from the watch bucket, that
	// a watch asking for initial state takes (sendInitialEvents=true, or no
	// resourceVersion or resourceVersion "0" without
	// sendInitialEvents=false), because it costs the API server a LIST. Must not exceed watchBurst. Between 1 and 1000;
	// default 1.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=1
	// +optional
	InitialStateCost *int32 `json:"initialStateCost,omitempty"`

	// listsPerMinute is the rate, in lists per minute, at which an identity's
	// list bucket refills; 0 means lists are not budgeted (relists after a
	// "too old" are the next storm: budget them when watches are already
	// limited). Between 0 and 100000; default 0.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=0
	// +optional
	ListsPerMinute *int32 `json:"listsPerMinute,omitempty"`

	// listBurst is the size, in lists, of an identity's list bucket. Must be
	// at least 1 when listsPerMinute is set. Between 0 and 100000; default
	// 10.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=10
	// +optional
	ListBurst *int32 `json:"listBurst,omitempty"`

	// listsPerMinutePerResource is the rate, in rebuilds per minute, at
	// which each of an identity's rebuild buckets refills: one bucket per
	// API group and resource. A rebuild is what a client sends to fill its
	// cache of a resource from scratch: a LIST (its first page; the pages
	// that continue it are free) or a watch that asks for initial state (a
	// watch-list). A rebuild takes a token of its resource's bucket besides
	// what the list or watch bucket takes, so that an agent that resets one
	// resource's cache again and again runs out of that resource's tokens,
	// not of those its other resources need. 0 means rebuilds are not
	// limited per resource. Between 0 and 100000; default 0.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=0
	// +optional
	ListsPerMinutePerResource *int32 `json:"listsPerMinutePerResource,omitempty"`

	// listBurstPerResource is the size, in rebuilds, of each of an
	// identity's rebuild buckets. Must be at least 1 when
	// listsPerMinutePerResource is set. Between 0 and 100000; default 5.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=5
	// +optional
	ListBurstPerResource *int32 `json:"listBurstPerResource,omitempty"`
}

// Aggregate bounds, per impersonating caller, the sum of the watches it
// opens on behalf of others, whoever it names.
//
// +kubebuilder:validation:XValidation:rule="!has(self.watchOpensPerMinute) || self.watchOpensPerMinute == 0 || (has(self.watchBurst) && self.watchBurst >= 1)",message="watchBurst must be at least 1 when watchOpensPerMinute is set",fieldPath=".watchBurst"
// +kubebuilder:validation:XValidation:rule="(has(self.watchOpensPerMinute) && self.watchOpensPerMinute > 0) || (has(self.maxConcurrentWatches) && self.maxConcurrentWatches > 0)",message="an aggregate must bound something: set watchOpensPerMinute or maxConcurrentWatches"
type Aggregate struct {
	// watchOpensPerMinute is the rate, in watch opens per minute, at which
	// a caller's aggregate bucket refills: every watch it opens for someone
	// else takes one token. 0 or unset: opens are not bounded in sum.
	// Between 0 and 100000.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	WatchOpensPerMinute *int32 `json:"watchOpensPerMinute,omitempty"`
	// watchBurst is the size, in watch opens, of a caller's aggregate
	// bucket. Must be at least 1 when watchOpensPerMinute is set. Between 0
	// and 100000.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	WatchBurst *int32 `json:"watchBurst,omitempty"`
	// maxConcurrentWatches caps the watches a caller may hold open for
	// others at once (per proxy replica), in sum. 0 or unset: no cap.
	// Between 0 and 100000.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	MaxConcurrentWatches *int32 `json:"maxConcurrentWatches,omitempty"`
}

// Backoff configures the exponential backoff of clients whose watches keep
// failing. It is kept per identity × resource × namespace × selectors, so a
// broken watch does not slow down the same client's healthy ones.
//
// +kubebuilder:validation:XValidation:rule="!has(self.initialDelaySeconds) || !has(self.maxDelaySeconds) || self.maxDelaySeconds >= self.initialDelaySeconds",message="maxDelaySeconds must be at least initialDelaySeconds",fieldPath=".maxDelaySeconds"
// +kubebuilder:validation:XValidation:rule="!has(self.shortWatchSeconds) || !has(self.resetAfterSeconds) || self.resetAfterSeconds >= self.shortWatchSeconds",message="resetAfterSeconds must be at least shortWatchSeconds",fieldPath=".resetAfterSeconds"
type Backoff struct {
	// initialDelaySeconds is the delay, in seconds, imposed after the first
	// failed watch; each further failure doubles it (with jitter). Only a
	// watch opened after the delay ran out counts: watches open together
	// that fail together count once. 0 disables the backoff. Between 0 and
	// 3600; default 1.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	// +kubebuilder:default=1
	// +optional
	InitialDelaySeconds *int32 `json:"initialDelaySeconds,omitempty"`

	// maxDelaySeconds caps the delay, in seconds. Must be at least
	// initialDelaySeconds. Between 0 and 3600; default 60.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	// +kubebuilder:default=60
	// +optional
	MaxDelaySeconds *int32 `json:"maxDelaySeconds,omitempty"`

	// shortWatchSeconds is the lifetime, in seconds, below which a watch
	// that ends counts as a failure (a watch that ends with an error always
	// does). Between 0 and 3600; default 10.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	// +kubebuilder:default=10
	// +optional
	ShortWatchSeconds *int32 `json:"shortWatchSeconds,omitempty"`

	// resetAfterSeconds is the lifetime, in seconds, after which a watch
	// clears its key's backoff. Must be at least shortWatchSeconds. Between
	// 0 and 86400; default 120 (client-go's reflector resets after 2
	// minutes too).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:default=120
	// +optional
	ResetAfterSeconds *int32 `json:"resetAfterSeconds,omitempty"`
}

// StaleAction is what happens to a watch that asks for a resourceVersion
// the API server already answered "too old" for: Reject or Pass.
type StaleAction string

const (
	// StaleActionReject answers the watch locally.
	StaleActionReject StaleAction = "Reject"
	// StaleActionPass forwards it to the API server.
	StaleActionPass StaleAction = "Pass"
)

// StaleMatch says which resourceVersions a "too old" answer makes stale:
// Exact or AtOrBelow.
type StaleMatch string

const (
	// StaleMatchExact makes only the version the API server called too old
	// stale.
	StaleMatchExact StaleMatch = "Exact"
	// StaleMatchAtOrBelow makes every version at or below it stale too, for
	// the same API group and resource.
	StaleMatchAtOrBelow StaleMatch = "AtOrBelow"
)

// StaleVersions configures the memory of resourceVersions the API server
// has declared too old.
type StaleVersions struct {
	// action is Reject (answer the watch locally exactly as the API server
	// would: HTTP 200 and one ERROR event with a 410 Expired "too old
	// resource version" Status, without asking the API server) or Pass
	// (forward it). Default Reject.
	// +kubebuilder:validation:Enum=Reject;Pass
	// +kubebuilder:default=Reject
	// +optional
	Action StaleAction `json:"action,omitempty"`

	// match is which versions a "too old" answer makes stale for its API
	// group and resource: AtOrBelow (default) or Exact. Versions are
	// compared as kube-apiserver parses them (base-10 unsigned 64-bit
	// integers, so "000100" is 100); "", "0" and versions that do not parse
	// are never stale. AtOrBelow rejects every version at or below the
	// highest one reported too old: kube-apiserver's versions are etcd
	// revisions, its window of history only moves forward, so such versions
	// are too old as well, and a storm of clients each holding its own stale
	// version costs one upstream watch instead of one per version. With
	// several API servers with different windows behind one address, or an
	// etcd restored from backup, AtOrBelow may refuse a version one of them
	// still holds: the client then relists once, as after a real 410. Exact
	// rejects only the very versions reported.
	// +kubebuilder:validation:Enum=Exact;AtOrBelow
	// +kubebuilder:default=AtOrBelow
	// +optional
	Match StaleMatch `json:"match,omitempty"`

	// memorySeconds is how long, in seconds, a "too old" answer counts (see
	// match) after the API server last gave it. Between 1 and
	// 86400; default 900.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:default=900
	// +optional
	MemorySeconds *int32 `json:"memorySeconds,omitempty"`
}
