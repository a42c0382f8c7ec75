package controllers

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

// Defaults the CRD applies (see the +kubebuilder:default markers in
// api/v1alpha1). ToBudget applies the same ones to fields that are unset, so
// that an object that bypassed defaulting (a unit test, an object stored
// before a field existed) means what the documentation says.
const (
	defaultPrecedence           = 1000
	defaultWatchOpensPerMinute  = 60
	defaultWatchBurst           = 30
	defaultMaxConcurrentWatches = 0
	defaultInitialStateCost     = 1
	defaultListsPerMinute       = 0
	defaultListBurst            = 10
	defaultInitialDelaySeconds  = 1
	defaultMaxDelaySeconds      = 60
	defaultShortWatchSeconds    = 10
	defaultResetAfterSeconds    = 120
	defaultStaleMemorySeconds   = 900
)

// Compiled is the outcome of compiling a set of WatchBudgets.
type Compiled struct {
	// Budgets are the valid budgets, ready for ratelimit.NewPolicy.
	Budgets []ratelimit.Budget
	// Generations maps each valid budget's name to the generation compiled.
	Generations map[string]int64
	// Invalid maps each invalid budget's name to why it is invalid.
	Invalid map[string]error
}

// Compile converts and validates every budget; invalid ones are reported in
// Invalid and left out, so that one bad budget never disables the others. A
// budget being deleted is enforced until it is gone.
func Compile(wbs []v1alpha1.WatchBudget) Compiled {
	c := Compiled{Generations: make(map[string]int64, len(wbs)), Invalid: map[string]error{}}
	for i := range wbs {
		wb := &wbs[i]
		b, err := ToBudget(wb)
		if err != nil {
			c.Invalid[wb.Name] = err
			continue
		}
		c.Budgets = append(c.Budgets, b)
		c.Generations[wb.Name] = wb.Generation
	}
	return c
}

// ToBudget converts a WatchBudget into the engine's Budget and validates it:
// the engine's own Budget.Validate, plus the rules the CRD states in OpenAPI
// and CEL. The CRD normally rejects such objects at the API server; checking
// again here covers objects stored under an older or hand-edited CRD. The
// error is one line, field paths relative to spec, ready for a condition
// message.
func ToBudget(wb *v1alpha1.WatchBudget) (ratelimit.Budget, error) {
	s := &wb.Spec
	l, bo, sv := &s.Limits, &s.Backoff, &s.StaleVersions
	b := ratelimit.Budget{
		Name:       wb.Name,
		Precedence: s.Precedence,
		Limits: ratelimit.Limits{
			WatchOpensPerMinute:  deref(l.WatchOpensPerMinute, defaultWatchOpensPerMinute),
			WatchBurst:           deref(l.WatchBurst, defaultWatchBurst),
			MaxConcurrentWatches: deref(l.MaxConcurrentWatches, defaultMaxConcurrentWatches),
			InitialStateCost:     deref(l.InitialStateCost, defaultInitialStateCost),
			ListsPerMinute:       deref(l.ListsPerMinute, defaultListsPerMinute),
			ListBurst:            deref(l.ListBurst, defaultListBurst),
		},
		Backoff: ratelimit.Backoff{
			Initial:    seconds(deref(bo.InitialDelaySeconds, defaultInitialDelaySeconds)),
			Max:        seconds(deref(bo.MaxDelaySeconds, defaultMaxDelaySeconds)),
			ShortWatch: seconds(deref(bo.ShortWatchSeconds, defaultShortWatchSeconds)),
			ResetAfter: seconds(deref(bo.ResetAfterSeconds, defaultResetAfterSeconds)),
		},
		StaleVersions: ratelimit.StaleVersions{
			Action: ratelimit.StaleAction(sv.Action),
			Memory: seconds(deref(sv.MemorySeconds, defaultStaleMemorySeconds)),
		},
	}
	if b.Precedence == 0 {
		b.Precedence = defaultPrecedence
	}
	if b.StaleVersions.Action == "" {
		b.StaleVersions.Action = ratelimit.StaleReject
	}
	switch s.Impersonation {
	case v1alpha1.ImpersonationImpersonated:
		b.Impersonation = ratelimit.ImpersonatedOnly
	case v1alpha1.ImpersonationDirect:
		b.Impersonation = ratelimit.DirectOnly
	}
	switch s.Enforcement {
	case "", v1alpha1.EnforcementEnforce:
		b.Enforcement = ratelimit.Enforce
	case v1alpha1.EnforcementDryRun:
		b.Enforcement = ratelimit.DryRun
	case v1alpha1.EnforcementExempt:
		b.Enforcement = ratelimit.Exempt
	}
	for _, sub := range s.Subjects {
		b.Subjects = append(b.Subjects, ratelimit.Subject{Kind: ratelimit.SubjectKind(sub.Kind), Name: sub.Name, Namespace: sub.Namespace})
	}
	for _, r := range s.Resources {
		b.Resources = append(b.Resources, ratelimit.ResourceRule{APIGroups: r.APIGroups, Resources: r.Resources, Namespaces: r.Namespaces})
	}

	errs := validateSpec(s, &b)
	if len(errs) == 0 {
		// The engine's own rules; ours cover them so far, so this only
		// speaks when the engine grows a rule the CRD does not know yet.
		if err := b.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return ratelimit.Budget{}, joinErrors(errs)
	}
	return b, nil
}

// joinErrors joins errors (and the errors they join) on one line, as a
// condition message wants them.
func joinErrors(errs []error) error {
	var msgs []string
	var add func(err error)
	add = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				add(e)
			}
			return
		}
		msgs = append(msgs, err.Error())
	}
	for _, err := range errs {
		add(err)
	}
	return errors.New(strings.Join(msgs, "; "))
}

// validateSpec repeats the CRD's rules (bounds, enums, CEL) on the spec and
// its converted budget.
func validateSpec(s *v1alpha1.WatchBudgetSpec, b *ratelimit.Budget) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	inRange := func(path string, v, lo, hi int32) {
		if v < lo || v > hi {
			bad("%s: must be between %d and %d, not %d", path, lo, hi, v)
		}
	}

	inRange("precedence", b.Precedence, 1, 10000)
	switch s.Impersonation {
	case "", v1alpha1.ImpersonationAny, v1alpha1.ImpersonationImpersonated, v1alpha1.ImpersonationDirect:
	default:
		bad("impersonation: unsupported value %q: must be Any, Impersonated or Direct", s.Impersonation)
	}
	switch s.Enforcement {
	case "", v1alpha1.EnforcementEnforce, v1alpha1.EnforcementDryRun, v1alpha1.EnforcementExempt:
	default:
		bad("enforcement: unsupported value %q: must be Enforce, DryRun or Exempt", s.Enforcement)
	}
	if n := len(s.Subjects); n > 64 {
		bad("subjects: must have at most 64 items, not %d", n)
	}
	for i, sub := range s.Subjects {
		p := fmt.Sprintf("subjects[%d]", i)
		switch sub.Kind {
		case v1alpha1.SubjectKindUser, v1alpha1.SubjectKindGroup:
			if sub.Namespace != "" {
				bad("%s.namespace: not allowed for kind %s", p, sub.Kind)
			}
		case v1alpha1.SubjectKindServiceAccount:
			if sub.Namespace == "" {
				bad("%s.namespace: required for kind ServiceAccount", p)
			}
			checkPattern(&errs, p+".namespace", sub.Namespace, 64)
		default:
			bad("%s.kind: unsupported value %q: must be User, Group or ServiceAccount", p, sub.Kind)
		}
		if sub.Name == "" {
			bad("%s.name: required", p)
		}
		checkPattern(&errs, p+".name", sub.Name, 253)
	}
	if n := len(s.Resources); n > 32 {
		bad("resources: must have at most 32 items, not %d", n)
	}
	for i, r := range s.Resources {
		p := fmt.Sprintf("resources[%d]", i)
		checkList(&errs, p+".apiGroups", r.APIGroups, 32, 253)
		checkList(&errs, p+".resources", r.Resources, 64, 253)
		checkList(&errs, p+".namespaces", r.Namespaces, 64, 63)
	}

	l := &b.Limits
	inRange("limits.watchOpensPerMinute", l.WatchOpensPerMinute, 0, 100000)
	inRange("limits.watchBurst", l.WatchBurst, 0, 100000)
	inRange("limits.maxConcurrentWatches", l.MaxConcurrentWatches, 0, 100000)
	inRange("limits.initialStateCost", l.InitialStateCost, 1, 1000)
	inRange("limits.listsPerMinute", l.ListsPerMinute, 0, 100000)
	inRange("limits.listBurst", l.ListBurst, 0, 100000)
	if l.WatchOpensPerMinute > 0 && l.WatchBurst < 1 {
		bad("limits.watchBurst: must be at least 1 when watchOpensPerMinute is set")
	}
	if l.WatchOpensPerMinute > 0 && l.InitialStateCost > l.WatchBurst {
		bad("limits.initialStateCost: must not exceed watchBurst (%d), or a watch that asks for initial state could never be admitted", l.WatchBurst)
	}
	if l.ListsPerMinute > 0 && l.ListBurst < 1 {
		bad("limits.listBurst: must be at least 1 when listsPerMinute is set")
	}

	bo := &s.Backoff
	initial := deref(bo.InitialDelaySeconds, defaultInitialDelaySeconds)
	maxDelay := deref(bo.MaxDelaySeconds, defaultMaxDelaySeconds)
	short := deref(bo.ShortWatchSeconds, defaultShortWatchSeconds)
	reset := deref(bo.ResetAfterSeconds, defaultResetAfterSeconds)
	inRange("backoff.initialDelaySeconds", initial, 0, 3600)
	inRange("backoff.maxDelaySeconds", maxDelay, 0, 3600)
	inRange("backoff.shortWatchSeconds", short, 0, 3600)
	inRange("backoff.resetAfterSeconds", reset, 0, 86400)
	if maxDelay < initial {
		bad("backoff.maxDelaySeconds: must be at least initialDelaySeconds (%d)", initial)
	}
	if reset < short {
		bad("backoff.resetAfterSeconds: must be at least shortWatchSeconds (%d)", short)
	}

	switch s.StaleVersions.Action {
	case "", v1alpha1.StaleActionReject, v1alpha1.StaleActionPass:
	default:
		bad("staleVersions.action: unsupported value %q: must be Reject or Pass", s.StaleVersions.Action)
	}
	inRange("staleVersions.memorySeconds", deref(s.StaleVersions.MemorySeconds, defaultStaleMemorySeconds), 1, 86400)
	return errs
}

// checkPattern enforces a name that is exact or a prefix ending in '*', of
// at most maxLen bytes.
func checkPattern(errs *[]error, path, v string, maxLen int) {
	if len(v) > maxLen {
		*errs = append(*errs, fmt.Errorf("%s: must be at most %d characters", path, maxLen))
	}
	if i := strings.IndexByte(v, '*'); i >= 0 && i != len(v)-1 {
		*errs = append(*errs, fmt.Errorf("%s: '*' is allowed only as the last character", path))
	}
}

func checkList(errs *[]error, path string, vs []string, maxItems, maxLen int) {
	if len(vs) > maxItems {
		*errs = append(*errs, fmt.Errorf("%s: must have at most %d items, not %d", path, maxItems, len(vs)))
	}
	for i, v := range vs {
		if len(v) > maxLen {
			*errs = append(*errs, fmt.Errorf("%s[%d]: must be at most %d characters", path, i, maxLen))
		}
	}
}

func deref(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

func seconds(s int32) time.Duration { return time.Duration(s) * time.Second }
