package ratelimit

import (
	"errors"
	"fmt"
	"strings"
)

// Validate reports every problem with the budget at once, each as a field
// path and what is wrong with it, e.g.
//
//	limits.watchBurst: must be >= 1 when watchOpensPerMinute > 0
//
// Empty Enforcement and empty StaleVersions.Action are valid and mean
// Enforce and StaleReject (NewPolicy fills them in).
func (b *Budget) Validate() error {
	var errs []error
	bad := func(path, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}

	if b.Name == "" {
		bad("name", "must not be empty")
	}
	switch b.Impersonation {
	case "", AnyRequest, ImpersonatedOnly, DirectOnly:
	default:
		bad("impersonation", "must be one of Any, Impersonated, Direct, got %q", b.Impersonation)
	}
	switch b.Enforcement {
	case "", Enforce, DryRun, Exempt:
	default:
		bad("enforcement", "must be one of Enforce, DryRun, Exempt, got %q", b.Enforcement)
	}
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
			checkPattern(bad, p+".namespace", s.Namespace)
		default:
			bad(p+".kind", "must be one of User, Group, ServiceAccount, got %q", s.Kind)
		}
		if s.Name == "" {
			bad(p+".name", "must not be empty (use \"*\" for any)")
		}
		checkPattern(bad, p+".name", s.Name)
	}
	for i, r := range b.Resources {
		p := fmt.Sprintf("resources[%d]", i)
		for j, v := range r.APIGroups {
			checkPattern(bad, fmt.Sprintf("%s.apiGroups[%d]", p, j), v)
		}
		for j, v := range r.Resources {
			if v == "" {
				bad(fmt.Sprintf("%s.resources[%d]", p, j), "must not be empty")
			}
			checkPattern(bad, fmt.Sprintf("%s.resources[%d]", p, j), v)
		}
		for j, v := range r.Namespaces {
			checkPattern(bad, fmt.Sprintf("%s.namespaces[%d]", p, j), v)
		}
	}

	l := b.Limits
	for _, f := range []struct {
		name string
		v    int32
	}{
		{"watchOpensPerMinute", l.WatchOpensPerMinute},
		{"watchBurst", l.WatchBurst},
		{"maxConcurrentWatches", l.MaxConcurrentWatches},
		{"initialStateCost", l.InitialStateCost},
		{"listsPerMinute", l.ListsPerMinute},
		{"listBurst", l.ListBurst},
	} {
		if f.v < 0 {
			bad("limits."+f.name, "must be >= 0")
		}
	}
	if l.WatchOpensPerMinute > 0 {
		if l.WatchBurst < 1 {
			bad("limits.watchBurst", "must be >= 1 when watchOpensPerMinute > 0")
		} else if l.InitialStateCost > l.WatchBurst {
			// Such a watch could never be admitted.
			bad("limits.initialStateCost", "must be <= watchBurst (%d)", l.WatchBurst)
		}
	}
	if l.ListsPerMinute > 0 && l.ListBurst < 1 {
		bad("limits.listBurst", "must be >= 1 when listsPerMinute > 0")
	}

	bo := b.Backoff
	switch {
	case bo.Initial < 0:
		bad("backoff.initial", "must be >= 0")
	case bo.Initial > 0 && bo.Max < bo.Initial:
		bad("backoff.max", "must be >= backoff.initial (%s)", bo.Initial)
	}
	if bo.ShortWatch < 0 {
		bad("backoff.shortWatch", "must be >= 0")
	}
	if bo.ResetAfter < 0 {
		bad("backoff.resetAfter", "must be >= 0")
	} else if bo.ResetAfter > 0 && bo.ResetAfter < bo.ShortWatch {
		// A watch between the two would be a failure that also clears.
		bad("backoff.resetAfter", "must be >= backoff.shortWatch (%s) when set", bo.ShortWatch)
	}

	switch b.StaleVersions.Action {
	case "", StaleReject, StalePass:
	default:
		bad("staleVersions.action", "must be one of Reject, Pass, got %q", b.StaleVersions.Action)
	}
	if b.StaleVersions.Memory < 0 {
		bad("staleVersions.memory", "must be >= 0")
	}
	return errors.Join(errs...)
}

// checkPattern rejects a '*' anywhere but at the end: patterns are exact
// names or prefixes.
func checkPattern(bad func(path, format string, args ...any), path, v string) {
	if i := strings.IndexByte(v, '*'); i >= 0 && i != len(v)-1 {
		bad(path, "'*' is only allowed at the end, got %q", v)
	}
}
