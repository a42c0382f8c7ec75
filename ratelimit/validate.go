package ratelimit

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// FieldError is one problem with a Budget: the field, by its path in
// Budget's terms with lowerCamel names (limits.watchBurst, backoff.max,
// subjects[0].name), and what is wrong with it. Detail names other fields
// by the same paths.
type FieldError struct {
	Path   string
	Detail string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Detail }

// Bounds of a Budget's fields. They are the WatchBudget CRD's (its
// validation markers in api/v1alpha1, enforced by the API server); a test in
// controllers walks the generated CRD and checks that Validate agrees with
// it, so that the two cannot drift.
const (
	maxPrecedence     = 10000
	maxSubjects       = 64
	maxSubjectName    = 253
	maxSubjectNS      = 64
	maxResourceRules  = 32
	maxAPIGroups      = 32
	maxResources      = 64
	maxNamespaces     = 64
	maxNameLen        = 253 // API groups and resources
	maxNamespaceLen   = 63
	maxRate           = 100000 // opens or lists per minute, bursts, watches
	maxInitialCost    = 1000
	maxDelay          = time.Hour
	maxResetAfter     = 24 * time.Hour
	maxStaleMemory    = 24 * time.Hour
	maxShare          = 100
	minHeadroom       = 100
	maxHeadroom       = 1000
	patternRule       = "'*' is only allowed at the end"
	namespaceCharRule = "only lower-case letters, digits, '-' and a final '*' are allowed"
)

// Validate reports every problem with the budget at once, each a
// *FieldError joined with errors.Join, e.g.
//
//	limits.watchBurst: must be >= 1 when watchOpensPerMinute > 0
//
// It is the one Go check of a budget: the bounds are the WatchBudget CRD's,
// and the engine's own rules (a burst for a rate, a cost the burst can
// pay, a reset no shorter than a short watch). Zero values keep the meaning
// the types document: Precedence 0 sorts first, InitialStateCost 0 is 1,
// Backoff.Initial 0 disables the backoff, ResetAfter 0 clears on any watch
// that is not a failure, StaleVersions.Memory 0 disables the memory; empty
// Enforcement and StaleVersions.Action mean Enforce and StaleReject
// (NewPolicy fills them in).
func (b *Budget) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, &FieldError{Path: path, Detail: fmt.Sprintf(format, args...)})
	}
	between := func(path string, v, lo, hi int64) {
		switch {
		case v < lo:
			bad(path, "must be >= %d", lo)
		case v > hi:
			bad(path, "must be <= %d, not %d", hi, v)
		}
	}
	maxItems := func(path string, n, most int) {
		if n > most {
			bad(path, "must have at most %d items, not %d", most, n)
		}
	}
	maxLen := func(path, v string, most int) {
		if len(v) > most {
			bad(path, "must be at most %d characters, not %d", most, len(v))
		}
	}
	durationBetween := func(path string, d, hi time.Duration) {
		switch {
		case d < 0:
			bad(path, "must be >= 0s")
		case d > hi:
			bad(path, "must be <= %s, not %s", seconds(hi), seconds(d))
		}
	}

	if b.Name == "" {
		bad("name", "must not be empty")
	}
	between("precedence", int64(b.Precedence), 0, maxPrecedence)
	switch b.Impersonation {
	case "", AnyRequest, ImpersonatedOnly, DirectOnly:
	default:
		bad("impersonation", "must be one of Any, Impersonated, Direct, not %q", b.Impersonation)
	}
	switch b.Enforcement {
	case "", Enforce, DryRun, Exempt:
	default:
		bad("enforcement", "must be one of Enforce, DryRun, Exempt, not %q", b.Enforcement)
	}

	maxItems("subjects", len(b.Subjects), maxSubjects)
	for i, s := range b.Subjects {
		p := fmt.Sprintf("subjects[%d]", i)
		switch s.Kind {
		case User, Group:
			if s.Namespace != "" {
				bad(p+".namespace", "must be empty for kind %s", s.Kind)
			}
		case ServiceAccount:
			if s.Namespace == "" {
				bad(p+".namespace", "must not be empty for kind ServiceAccount (use \"*\" for any)")
			}
			maxLen(p+".namespace", s.Namespace, maxSubjectNS)
			checkPattern(bad, p+".namespace", s.Namespace)
			if !namespacePattern(s.Namespace) {
				bad(p+".namespace", "%s, not %q", namespaceCharRule, s.Namespace)
			}
		default:
			bad(p+".kind", "must be one of User, Group, ServiceAccount, not %q", s.Kind)
		}
		if s.Name == "" {
			bad(p+".name", "must not be empty (use \"*\" for any)")
		}
		maxLen(p+".name", s.Name, maxSubjectName)
		checkPattern(bad, p+".name", s.Name)
	}

	maxItems("resources", len(b.Resources), maxResourceRules)
	for i, r := range b.Resources {
		p := fmt.Sprintf("resources[%d]", i)
		for _, list := range []struct {
			name     string
			vs       []string
			most     int
			mostLen  int
			nonEmpty bool
		}{
			{"apiGroups", r.APIGroups, maxAPIGroups, maxNameLen, false},
			{"resources", r.Resources, maxResources, maxNameLen, true},
			{"namespaces", r.Namespaces, maxNamespaces, maxNamespaceLen, false},
		} {
			maxItems(p+"."+list.name, len(list.vs), list.most)
			for j, v := range list.vs {
				path := fmt.Sprintf("%s.%s[%d]", p, list.name, j)
				if list.nonEmpty && v == "" {
					bad(path, "must not be empty")
				}
				maxLen(path, v, list.mostLen)
				checkPattern(bad, path, v)
			}
		}
	}

	l := b.Limits
	between("limits.watchOpensPerMinute", int64(l.WatchOpensPerMinute), 0, maxRate)
	between("limits.watchBurst", int64(l.WatchBurst), 0, maxRate)
	between("limits.maxConcurrentWatches", int64(l.MaxConcurrentWatches), 0, maxRate)
	between("limits.initialStateCost", int64(l.InitialStateCost), 0, maxInitialCost)
	between("limits.listsPerMinute", int64(l.ListsPerMinute), 0, maxRate)
	between("limits.listBurst", int64(l.ListBurst), 0, maxRate)
	if l.WatchOpensPerMinute > 0 {
		if l.WatchBurst < 1 {
			bad("limits.watchBurst", "must be >= 1 when watchOpensPerMinute > 0")
		} else if l.InitialStateCost > l.WatchBurst {
			bad("limits.initialStateCost", "must be <= watchBurst (%d), or a watch that asks for initial state could never be admitted", l.WatchBurst)
		}
	}
	if l.ListsPerMinute > 0 && l.ListBurst < 1 {
		bad("limits.listBurst", "must be >= 1 when listsPerMinute > 0")
	}
	between("limits.listsPerMinutePerResource", int64(l.ListsPerMinutePerResource), 0, maxRate)
	between("limits.listBurstPerResource", int64(l.ListBurstPerResource), 0, maxRate)
	if l.ListsPerMinutePerResource > 0 && l.ListBurstPerResource < 1 {
		bad("limits.listBurstPerResource", "must be >= 1 when listsPerMinutePerResource > 0")
	}

	ag := b.Aggregate
	between("aggregate.watchOpensPerMinute", int64(ag.WatchOpensPerMinute), 0, maxRate)
	between("aggregate.watchBurst", int64(ag.WatchBurst), 0, maxRate)
	between("aggregate.maxConcurrentWatches", int64(ag.MaxConcurrentWatches), 0, maxRate)
	if ag.WatchOpensPerMinute > 0 && ag.WatchBurst < 1 {
		bad("aggregate.watchBurst", "must be >= 1 when watchOpensPerMinute > 0")
	}

	bo := b.Backoff
	durationBetween("backoff.initial", bo.Initial, maxDelay)
	durationBetween("backoff.max", bo.Max, maxDelay)
	durationBetween("backoff.shortWatch", bo.ShortWatch, maxDelay)
	durationBetween("backoff.resetAfter", bo.ResetAfter, maxResetAfter)
	if bo.Initial > 0 && bo.Max < bo.Initial {
		bad("backoff.max", "must be >= backoff.initial (%s)", seconds(bo.Initial))
	}
	if bo.ResetAfter > 0 && bo.ResetAfter < bo.ShortWatch {
		// A watch between the two would be a failure that also clears.
		bad("backoff.resetAfter", "must be >= backoff.shortWatch (%s) when set", seconds(bo.ShortWatch))
	}

	// 0 means the default (see Suggestion).
	if sg := b.Suggestion; sg.Share != 0 {
		between("suggestion.share", int64(sg.Share), 1, maxShare)
	}
	if sg := b.Suggestion; sg.HeadroomPercent != 0 {
		between("suggestion.headroomPercent", int64(sg.HeadroomPercent), minHeadroom, maxHeadroom)
	}

	switch b.StaleVersions.Action {
	case "", StaleReject, StalePass:
	default:
		bad("staleVersions.action", "must be one of Reject, Pass, not %q", b.StaleVersions.Action)
	}
	switch b.StaleVersions.Match {
	case "", StaleMatchExact, StaleMatchAtOrBelow:
	default:
		bad("staleVersions.match", "must be one of Exact, AtOrBelow, not %q", b.StaleVersions.Match)
	}
	durationBetween("staleVersions.memory", b.StaleVersions.Memory, maxStaleMemory)
	return errors.Join(errs...)
}

// checkPattern rejects a '*' anywhere but at the end: patterns are exact
// names or prefixes.
func checkPattern(bad func(path, format string, args ...any), path, v string) {
	if i := strings.IndexByte(v, '*'); i >= 0 && i != len(v)-1 {
		bad(path, "%s, not %q", patternRule, v)
	}
}

// namespacePattern reports whether v is a namespace name or prefix: lower
// case letters, digits and '-', optionally ending in '*' (the CRD's
// ^[-a-z0-9]*\*?$).
func namespacePattern(v string) bool {
	v = strings.TrimSuffix(v, "*")
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c != '-' && (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '*' {
			return false
		}
	}
	return true
}

// seconds formats d in seconds when it is whole ("3600s"), as the CRD
// states durations, and as time.Duration does otherwise.
func seconds(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return d.String()
}
