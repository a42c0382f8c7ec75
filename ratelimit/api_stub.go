package ratelimit

import (
	"errors"
	"sort"
	"sync/atomic"
	"time"
)

// Policy is an immutable compiled set of budgets.
type Policy struct{ budgets []Budget }

// NewPolicy compiles budgets.
func NewPolicy(budgets []Budget) (*Policy, error) {
	seen := map[string]bool{}
	out := make([]Budget, len(budgets))
	for i := range budgets {
		if err := budgets[i].Validate(); err != nil {
			return nil, err
		}
		if seen[budgets[i].Name] {
			return nil, errors.New("duplicate budget name " + budgets[i].Name)
		}
		seen[budgets[i].Name] = true
		out[i] = budgets[i]
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Precedence != out[j].Precedence {
			return out[i].Precedence < out[j].Precedence
		}
		return out[i].Name < out[j].Name
	})
	return &Policy{budgets: out}, nil
}

// Validate checks a budget.
func (b *Budget) Validate() error {
	if b.Name == "" {
		return errors.New("name: must not be empty")
	}
	return nil
}

// Budgets returns a copy in match order.
func (p *Policy) Budgets() []Budget { return append([]Budget(nil), p.budgets...) }

// Match returns the governing budget.
func (p *Policy) Match(user string, groups []string, group, resource, namespace string) *Budget {
	return nil
}

type Verb uint8

const (
	VerbWatch Verb = iota + 1
	VerbList
)

type Request struct {
	User                         string
	Groups                       []string
	Verb                         Verb
	Group, Resource, Namespace   string
	LabelSelector, FieldSelector string
	ResourceVersion              string
	SendInitialEvents            bool
}

type Reason string

const (
	ReasonNone                 Reason = ""
	ReasonRateLimited          Reason = "RateLimited"
	ReasonTooManyWatches       Reason = "TooManyWatches"
	ReasonBackingOff           Reason = "BackingOff"
	ReasonStaleResourceVersion Reason = "StaleResourceVersion"
)

type Decision struct {
	Allowed     bool
	Reason      Reason
	RetryAfter  time.Duration
	Budget      string
	Enforcement Enforcement
	DryRun      bool
	Watch       Watch
}

type Watch struct{ seq uint64 }

func (w Watch) Valid() bool { return w.seq != 0 }

type Outcome uint8

const (
	OutcomeClosed Outcome = iota + 1
	OutcomeError
)

type Options struct {
	MaxTrackedKeys         int
	IdleAfter              time.Duration
	Seed                   uint64
	OnThrottled            func(budget, user string, reason Reason, dryRun bool)
	ThrottleNotifyInterval time.Duration
}

type Engine struct{ p atomic.Pointer[Policy] }

func NewEngine(opts Options) *Engine { e := &Engine{}; e.p.Store(&Policy{}); return e }

func (e *Engine) SetPolicy(now time.Time, p *Policy)                                      { e.p.Store(p) }
func (e *Engine) Policy() *Policy                                                         { return e.p.Load() }
func (e *Engine) Decide(now time.Time, r *Request) Decision                               { return Decision{Allowed: true} }
func (e *Engine) WatchEnded(now time.Time, w Watch, lifetime time.Duration, o Outcome)    {}
func (e *Engine) StaleVersionSeen(now time.Time, group, resource, resourceVersion string) {}
func (e *Engine) Sweep(now time.Time) (evicted int)                                       { return 0 }

type BudgetStats struct {
	ActiveWatches     int64
	TrackedIdentities int64
	Decisions         map[Reason]int64
	TopOffenders      []Offender
}
type Offender struct {
	User       string
	Rejections int64
}

func (e *Engine) Stats() map[string]BudgetStats { return map[string]BudgetStats{} }
