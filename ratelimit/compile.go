package ratelimit

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// NewPolicy validates and compiles budgets, all or nothing: it returns an
// error naming every invalid budget (see Budget.Validate) and every
// duplicated name, and then no Policy at all. CompileValid is the same for a
// caller that must not let one bad budget disturb the others (the
// controller).
//
// The budgets are copied: changing them afterwards does not change the
// Policy. Empty Enforcement becomes Enforce, empty StaleVersions.Action
// becomes StaleReject and empty StaleVersions.Match StaleMatchAtOrBelow:
// this is the one place these defaults are applied.
func NewPolicy(budgets []Budget) (*Policy, error) {
	p, invalid := CompileValid(budgets)
	if invalid == nil {
		return p, nil
	}
	var errs []error
	for i, err := range invalid {
		if err != nil {
			errs = append(errs, fmt.Errorf("budget %q: %w", budgets[i].Name, err))
		}
	}
	return nil, errors.Join(errs...)
}

// CompileValid validates each budget, once, and compiles the valid ones
// into a Policy, leaving out the others: invalid[i] says why budgets[i] was
// left out (every problem with it, see Budget.Validate, or a name an
// earlier budget already holds); invalid is nil when every budget is in.
// The copies and defaults are NewPolicy's.
func CompileValid(budgets []Budget) (p *Policy, invalid []error) {
	named := make(map[string]bool, len(budgets))
	p = &Policy{budgets: make([]Budget, 0, len(budgets))}
	leaveOut := func(i int, err error) {
		if invalid == nil {
			invalid = make([]error, len(budgets))
		}
		invalid[i] = err
	}
	for i := range budgets {
		b := budgets[i]
		if err := b.Validate(); err != nil {
			leaveOut(i, err)
			continue
		}
		if named[b.Name] {
			leaveOut(i, &FieldError{Path: "name", Detail: "duplicate"})
			continue
		}
		named[b.Name] = true
		p.budgets = append(p.budgets, compileBudget(b))
	}
	slices.SortFunc(p.budgets, func(a, b Budget) int {
		if a.Precedence != b.Precedence {
			return int(a.Precedence) - int(b.Precedence)
		}
		return strings.Compare(a.Name, b.Name)
	})
	p.matchers = make([]budgetMatcher, len(p.budgets))
	for i := range p.budgets {
		b := &p.budgets[i]
		p.longestStaleMemory = max(p.longestStaleMemory, b.StaleVersions.Memory)
		p.matchers[i] = budgetMatcher{
			skipImpersonated: b.Impersonation == DirectOnly,
			skipDirect:       b.Impersonation == ImpersonatedOnly,
			resources:        nilIfEmpty(b.Resources),
			subjects:         nilIfEmpty(compileSubjects(b.Subjects)),
		}
	}
	return p, invalid
}

// compileBudget deep-copies b and fills in defaults.
func compileBudget(b Budget) Budget {
	b.Subjects = slices.Clone(b.Subjects)
	b.Resources = slices.Clone(b.Resources)
	for i := range b.Resources {
		r := &b.Resources[i]
		r.APIGroups = slices.Clone(r.APIGroups)
		r.Resources = slices.Clone(r.Resources)
		r.Namespaces = slices.Clone(r.Namespaces)
	}
	if b.Enforcement == "" {
		b.Enforcement = Enforce
	}
	if b.StaleVersions.Action == "" {
		b.StaleVersions.Action = StaleReject
	}
	if b.StaleVersions.Match == "" {
		b.StaleVersions.Match = StaleMatchAtOrBelow
	}
	if b.Limits.InitialStateCost == 0 {
		b.Limits.InitialStateCost = 1
	}
	return b
}

// Budgets returns a copy of the compiled budgets, in match order.
func (p *Policy) Budgets() []Budget {
	if p == nil {
		return nil
	}
	out := make([]Budget, len(p.budgets))
	for i := range p.budgets {
		out[i] = compileBudget(p.budgets[i])
	}
	return out
}

// Match returns the budget that governs a direct (not impersonated)
// request by this identity for
// group/resource in namespace ("" for cluster-scoped or all-namespace
// requests): the first in match order whose subjects and resources both
// match. Nil means no budget governs the request, so it has no limits. The
// returned Budget belongs to the Policy and must not be modified.
func (p *Policy) Match(user string, groups []string, group, resource, namespace string) *Budget {
	if i := p.match(user, groups, group, resource, namespace); i >= 0 {
		return &p.budgets[i]
	}
	return nil
}

// match is Match returning the budget's index, or -1.
func (p *Policy) match(user string, groups []string, group, resource, namespace string) int {
	return p.matchRequest(user, groups, group, resource, namespace, false)
}

// matchRequest is match for a request that is impersonated or not (see
// Budget.Impersonation).
func (p *Policy) matchRequest(user string, groups []string, group, resource, namespace string, impersonated bool) int {
	if p == nil {
		return -1
	}
	for i := range p.matchers {
		m := &p.matchers[i]
		if impersonated && m.skipImpersonated || !impersonated && m.skipDirect {
			continue
		}
		if (m.resources == nil || matchResources(m.resources, group, resource, namespace)) &&
			(m.subjects == nil || matchSubjects(m.subjects, user, groups)) {
			return i
		}
	}
	return -1
}

// budgetMatcher is what matchRequest needs of a budget.
type budgetMatcher struct {
	// skipImpersonated and skipDirect are Impersonation DirectOnly and
	// ImpersonatedOnly.
	skipImpersonated, skipDirect bool
	// resources and subjects are nil when empty (matching everything), so
	// that matchRequest calls no function for them.
	resources []ResourceRule
	subjects  []subjectMatcher
}

const serviceAccountPrefix = "system:serviceaccount:"

// subjectMatcher is a Subject compiled for matching.
type subjectMatcher struct {
	Subject
	// kind is Kind as a number (a string switch compares bytes).
	kind subjectKind
	// userPrefix, for a ServiceAccount subject whose namespace is exact, is
	// "system:serviceaccount:<namespace>:": a user matches when it has the
	// prefix and the rest matches Name. Namespaces hold no ':', so this is
	// the same as splitting the user name at its colons, in one comparison.
	userPrefix string
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

type subjectKind uint8

const (
	kindUnknown subjectKind = iota
	kindUser
	kindGroup
	kindServiceAccount
)

var kindOf = map[SubjectKind]subjectKind{User: kindUser, Group: kindGroup, ServiceAccount: kindServiceAccount}

func compileSubjects(subjects []Subject) []subjectMatcher {
	out := make([]subjectMatcher, len(subjects))
	for i, s := range subjects {
		out[i].Subject = s
		out[i].kind = kindOf[s.Kind]
		if s.Kind == ServiceAccount && !strings.ContainsAny(s.Namespace, ":*") {
			out[i].userPrefix = serviceAccountPrefix + s.Namespace + ":"
		}
	}
	return out
}

func matchSubjects(subjects []subjectMatcher, user string, groups []string) bool {
	if len(subjects) == 0 {
		return true
	}
	for i := range subjects {
		s := &subjects[i]
		switch s.kind {
		case kindUser:
			if matchName(s.Name, user) {
				return true
			}
		case kindGroup:
			for _, g := range groups {
				if matchName(s.Name, g) {
					return true
				}
			}
		case kindServiceAccount:
			if s.userPrefix != "" {
				// Every such user begins with serviceAccountPrefix, so the
				// namespace's first byte tells most apart before the
				// whole prefix is compared (userPrefix is longer: the
				// namespace is not empty).
				p := s.userPrefix
				if len(user) >= len(p) && user[len(serviceAccountPrefix)] == p[len(serviceAccountPrefix)] &&
					user[:len(p)] == p && matchName(s.Name, user[len(p):]) {
					return true
				}
			} else if rest, ok := strings.CutPrefix(user, serviceAccountPrefix); ok {
				ns, name, ok := strings.Cut(rest, ":")
				if ok && matchName(s.Namespace, ns) && matchName(s.Name, name) {
					return true
				}
			}
		}
	}
	return false
}

func matchResources(rules []ResourceRule, group, resource, namespace string) bool {
	if len(rules) == 0 {
		return true
	}
	for i := range rules {
		r := &rules[i]
		if matchAny(r.APIGroups, group) && matchAny(r.Resources, resource) && matchAny(r.Namespaces, namespace) {
			return true
		}
	}
	return false
}

// matchAny reports whether v matches one of patterns; no patterns match
// everything.
func matchAny(patterns []string, v string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if matchName(p, v) {
			return true
		}
	}
	return false
}

// matchName matches an exact name, or a prefix when pattern ends in '*'
// ("*" alone matches everything, "" only the empty string).
func matchName(pattern, v string) bool {
	if n := len(pattern); n > 0 && pattern[n-1] == '*' {
		return strings.HasPrefix(v, pattern[:n-1])
	}
	return pattern == v
}
