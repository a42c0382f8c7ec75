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
// api/v1alpha1; TestAPIServerDefaults checks they agree). convert applies
// them to fields that are unset, so that an object that bypassed defaulting
// (a unit test, an object stored before a field existed) means what the
// documentation says.
const (
	defaultPrecedence           = 1000
	defaultWatchOpensPerMinute  = 60
	defaultWatchBurst           = 30
	defaultMaxConcurrentWatches = 0
	defaultInitialStateCost     = 1
	defaultListsPerMinute       = 0
	defaultListBurst            = 10
	defaultListsPerResource     = 0
	defaultListBurstPerResource = 5
	defaultInitialDelaySeconds  = 1
	defaultMaxDelaySeconds      = 60
	defaultShortWatchSeconds    = 10
	defaultResetAfterSeconds    = 120
	defaultStaleMemorySeconds   = 900
	defaultSuggestionShare      = ratelimit.DefaultSuggestionShare
	defaultSuggestionHeadroom   = ratelimit.DefaultSuggestionHeadroomPercent
)

// Compiled is the outcome of compiling a set of WatchBudgets.
type Compiled struct {
	// Policy is compiled from the valid budgets.
	Policy *ratelimit.Policy
	// Budgets are the valid budgets, as converted (the engine's defaults
	// are the Policy's).
	Budgets []ratelimit.Budget
	// Generations maps each valid budget's name to the generation compiled.
	Generations map[string]int64
	// Invalid maps each invalid budget's name to why it is invalid.
	Invalid map[string]error
}

// Compile converts every budget and compiles the valid ones into a Policy
// (ratelimit.CompileValid, where each is validated, once); invalid ones are
// reported in Invalid, on one line with the spec's field paths, and left
// out, so that one bad budget never disables the others. A budget being
// deleted is enforced until it is gone.
func Compile(wbs []v1alpha1.WatchBudget) Compiled {
	c := Compiled{Generations: make(map[string]int64, len(wbs)), Invalid: map[string]error{}}
	budgets := make([]ratelimit.Budget, 0, len(wbs))
	generations := make([]int64, 0, len(wbs))
	for i := range wbs {
		wb := &wbs[i]
		b := convert(wb)
		if errs := unconvertible(&wb.Spec, &b); len(errs) > 0 {
			// Left out before CompileValid, so validated here, to report
			// every problem at once.
			if err := b.Validate(); err != nil {
				errs = append(errs, err)
			}
			c.Invalid[wb.Name] = joinErrors(errs)
			continue
		}
		budgets = append(budgets, b)
		generations = append(generations, wb.Generation)
	}
	p, invalid := ratelimit.CompileValid(budgets)
	c.Policy = p
	for i, b := range budgets {
		if invalid != nil && invalid[i] != nil {
			c.Invalid[b.Name] = joinErrors(invalid[i : i+1])
			continue
		}
		c.Budgets = append(c.Budgets, b)
		c.Generations[b.Name] = generations[i]
	}
	return c
}

// ToBudget is Compile for one WatchBudget: the engine's Budget, or why the
// budget is invalid. The check is the engine's (Budget.Validate, whose
// bounds are the CRD's); the API server enforces the same rules through the
// CRD, and checking here covers objects stored under an older or
// hand-edited CRD. The error is one line, field paths those of the spec,
// ready for a condition message.
func ToBudget(wb *v1alpha1.WatchBudget) (ratelimit.Budget, error) {
	c := Compile([]v1alpha1.WatchBudget{*wb})
	if err := c.Invalid[wb.Name]; err != nil {
		return ratelimit.Budget{}, err
	}
	return c.Budgets[0], nil
}

// convert maps a WatchBudget's spec onto the engine's Budget, applying the
// CRD's defaults to unset fields (the one place they are applied in Go: an
// object that bypassed the API server's defaulting, a unit test or one
// stored before a field existed, means what the documentation says). The
// enumerations the CRD defaults (enforcement, staleVersions.action) are left
// empty when unset: empty means the same default in the engine, which
// applies it.
func convert(wb *v1alpha1.WatchBudget) ratelimit.Budget {
	s := &wb.Spec
	l, bo, sv := &s.Limits, &s.Backoff, &s.StaleVersions
	b := ratelimit.Budget{
		Name:          wb.Name,
		Precedence:    s.Precedence,
		Enforcement:   ratelimit.Enforcement(s.Enforcement),
		Impersonation: ratelimit.Impersonation(s.Impersonation),
		Limits: ratelimit.Limits{
			WatchOpensPerMinute:       deref(l.WatchOpensPerMinute, defaultWatchOpensPerMinute),
			WatchBurst:                deref(l.WatchBurst, defaultWatchBurst),
			MaxConcurrentWatches:      deref(l.MaxConcurrentWatches, defaultMaxConcurrentWatches),
			InitialStateCost:          deref(l.InitialStateCost, defaultInitialStateCost),
			ListsPerMinute:            deref(l.ListsPerMinute, defaultListsPerMinute),
			ListBurst:                 deref(l.ListBurst, defaultListBurst),
			ListsPerMinutePerResource: deref(l.ListsPerMinutePerResource, defaultListsPerResource),
			ListBurstPerResource:      deref(l.ListBurstPerResource, defaultListBurstPerResource),
		},
		Backoff: ratelimit.Backoff{
			Initial:    seconds(deref(bo.InitialDelaySeconds, defaultInitialDelaySeconds)),
			Max:        seconds(deref(bo.MaxDelaySeconds, defaultMaxDelaySeconds)),
			ShortWatch: seconds(deref(bo.ShortWatchSeconds, defaultShortWatchSeconds)),
			ResetAfter: seconds(deref(bo.ResetAfterSeconds, defaultResetAfterSeconds)),
		},
		StaleVersions: ratelimit.StaleVersions{
			Action: ratelimit.StaleAction(sv.Action),
			Match:  ratelimit.StaleMatch(sv.Match),
			Memory: seconds(deref(sv.MemorySeconds, defaultStaleMemorySeconds)),
		},
		Suggestion: ratelimit.Suggestion{
			Share:           deref(s.Suggestion.Share, defaultSuggestionShare),
			HeadroomPercent: deref(s.Suggestion.HeadroomPercent, defaultSuggestionHeadroom),
		},
	}
	if b.Precedence == 0 {
		b.Precedence = defaultPrecedence
	}
	if ag := s.Aggregate; ag != nil {
		b.Aggregate = ratelimit.Aggregate{
			WatchOpensPerMinute:  deref(ag.WatchOpensPerMinute, 0),
			WatchBurst:           deref(ag.WatchBurst, 0),
			MaxConcurrentWatches: deref(ag.MaxConcurrentWatches, 0),
		}
	}
	for _, sub := range s.Subjects {
		b.Subjects = append(b.Subjects, ratelimit.Subject{Kind: ratelimit.SubjectKind(sub.Kind), Name: sub.Name, Namespace: sub.Namespace})
	}
	for _, r := range s.Resources {
		b.Resources = append(b.Resources, ratelimit.ResourceRule{APIGroups: r.APIGroups, Resources: r.Resources, Namespaces: r.Namespaces})
	}
	return b
}

// unconvertible reports the values the CRD refuses whose conversion the
// engine would read differently: in the engine, InitialStateCost 0 is 1,
// a Suggestion's 0 its default,
// StaleVersions.Memory 0 disables the memory and ResetAfter 0 clears on any
// watch that is not a failure; none of these is what the same 0 in a
// WatchBudget says (the CRD's minimum 1, and resetAfterSeconds >=
// shortWatchSeconds); nor an aggregate that is set and bounds nothing,
// which the engine's zero Aggregate reads as none. Every other rule is
// Budget.Validate's.
func unconvertible(s *v1alpha1.WatchBudgetSpec, b *ratelimit.Budget) []error {
	var errs []error
	if s.Aggregate != nil && b.Aggregate.WatchOpensPerMinute <= 0 && b.Aggregate.MaxConcurrentWatches <= 0 {
		errs = append(errs, errors.New("aggregate: must bound something: set watchOpensPerMinute or maxConcurrentWatches"))
	}
	if b.Limits.InitialStateCost == 0 {
		errs = append(errs, &ratelimit.FieldError{Path: "limits.initialStateCost", Detail: "must be >= 1"})
	}
	if b.StaleVersions.Memory == 0 {
		errs = append(errs, &ratelimit.FieldError{Path: "staleVersions.memory", Detail: "must be >= 1s"})
	}
	if b.Suggestion.Share == 0 {
		errs = append(errs, &ratelimit.FieldError{Path: "suggestion.share", Detail: "must be >= 1"})
	}
	if b.Suggestion.HeadroomPercent == 0 {
		errs = append(errs, &ratelimit.FieldError{Path: "suggestion.headroomPercent", Detail: "must be >= 100"})
	}
	if b.Backoff.ResetAfter == 0 && b.Backoff.ShortWatch > 0 {
		errs = append(errs, &ratelimit.FieldError{Path: "backoff.resetAfter", Detail: fmt.Sprintf("must be >= backoff.shortWatch (%s)", b.Backoff.ShortWatch)})
	}
	return errs
}

// specPaths renames the engine's field paths, in paths and details, to the
// WatchBudget spec's: durations carry their unit in the name. The other
// paths are the same in both.
var specPaths = strings.NewReplacer(
	"backoff.initial", "backoff.initialDelaySeconds",
	"backoff.max", "backoff.maxDelaySeconds",
	"backoff.shortWatch", "backoff.shortWatchSeconds",
	"backoff.resetAfter", "backoff.resetAfterSeconds",
	"staleVersions.memory", "staleVersions.memorySeconds",
)

// joinErrors joins errors (and the errors they join) on one line, as a
// condition message wants them, with field paths those of the spec.
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
		msgs = append(msgs, specPaths.Replace(err.Error()))
	}
	for _, err := range errs {
		add(err)
	}
	return errors.New(strings.Join(msgs, "; "))
}

func deref(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

func seconds(s int32) time.Duration { return time.Duration(s) * time.Second }
