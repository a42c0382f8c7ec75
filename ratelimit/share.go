package ratelimit

import (
	"cmp"
	"maps"
	"math"
	"slices"
)

// Shares are the fractions of each budget's per-identity limits one
// replica enforces, when several replicas enforce the same budgets
// (Engine.SetShares). The zero value, and a budget it does not name, is the
// whole budget: a replica alone enforces every limit in full.
//
// A fraction f scales an identity's MaxConcurrentWatches, WatchBurst and
// ListBurst to max(1, ⌊limit·f⌋) and its WatchOpensPerMinute and
// ListsPerMinute to limit·f; fractions are clamped to [0, 1], so a replica
// never admits more than the whole budget. Across N replicas whose
// fractions sum to 1 an identity gets its limit in all, plus at most N−1
// of each count from the rounding up to 1. Aggregates are not shared.
type Shares struct {
	// Others is the fraction of every budget Budgets does not name.
	Others float64
	// Budgets by name.
	Budgets map[string]BudgetShares
}

// BudgetShares are one budget's fractions on one replica.
type BudgetShares struct {
	// Default is the fraction of identities not in Identities.
	Default float64
	// Identities are the fractions of the identities with one of their own.
	Identities map[string]float64
}

// of returns the fraction of budget's limits that user gets.
func (s *Shares) of(budget, user string) float64 {
	if s == nil {
		return 1
	}
	f := s.Others
	if b, ok := s.Budgets[budget]; ok {
		if f, ok = b.Identities[user]; !ok {
			f = b.Default
		}
	}
	if math.IsNaN(f) {
		return 0
	}
	return min(max(f, 0), 1)
}

// scaleCount is a count limit (a cap or a burst) scaled by the fraction f:
// 0 (unlimited) stays 0; anything else is at least 1, so that a replica
// with a small share still admits one.
func scaleCount(limit int32, f float64) int32 {
	if limit <= 0 || f >= 1 {
		return limit
	}
	// The epsilon keeps a third of 30, computed as 0.333…·30, at 10.
	return max(1, int32(float64(limit)*f+1e-6))
}

// Demand is what one replica reports of a budget's identities: each one's
// use of the whole budget, as a fraction of its limits (see
// Engine.Demand). Identities using nothing are not listed.
type Demand struct {
	Identities map[string]float64 `json:"identities,omitempty"`
	// Held is, for the identities listed whose budget caps concurrent
	// watches, the fraction of the cap their open watches hold.
	Held map[string]float64 `json:"held,omitempty"`
}

// Report is one live replica's demand, by budget name, and the allocation
// it enforces.
type Report struct {
	Replica string
	Budgets map[string]Demand
	// Applied is the Generation of the allocation the replica enforces;
	// 0 when it has read none (it enforces an even split).
	Applied int64
}

// Allocation is what a leader computes from the replicas' reports: for
// each budget, the identities with a share of their own and their fraction
// on each replica. Every other identity gets 1/len(Replicas) on each.
type Allocation struct {
	// Generation counts the allocations written: each is one more than
	// the one before it.
	Generation int64 `json:"generation,omitempty"`
	// Replicas are the live replicas, sorted; fractions are in this order.
	Replicas []string `json:"replicas"`
	// Budgets: budget → user → fraction per replica.
	Budgets map[string]map[string][]float64 `json:"budgets,omitempty"`
}

// The allocation's targets, as KubeGateway's limiter allocation: a share
// aims at TargetUse of it in use; a replica that uses at least
// SaturatedUse of its share grows it at least by Grow.
const (
	TargetUse    = 0.7
	SaturatedUse = 0.9
	Grow         = 1.3
)

// Shares returns the fractions replica enforces under a, and whether a
// names it. A replica a does not name gets 1/(len(a.Replicas)+1) of every
// budget: the others already share the whole.
func (a *Allocation) Shares(replica string) (*Shares, bool) {
	i, found := slices.BinarySearch(a.Replicas, replica)
	n := len(a.Replicas)
	if !found {
		n++
	}
	s := &Shares{Others: 1 / float64(n), Budgets: make(map[string]BudgetShares, len(a.Budgets))}
	for budget, ids := range a.Budgets {
		bs := BudgetShares{Default: 1 / float64(n), Identities: make(map[string]float64, len(ids))}
		for user, fs := range ids {
			if found && i < len(fs) {
				bs.Identities[user] = fs[i]
			}
		}
		s.Budgets[budget] = bs
	}
	return s, found
}

// EqualShares is every budget split evenly over n replicas: what a replica
// enforces before any allocation names it.
func EqualShares(n int) *Shares {
	if n <= 1 {
		return nil
	}
	return &Shares{Others: 1 / float64(n)}
}

// Allocate computes the next allocation from the allocations written so
// far (history, oldest first, the last the one in force; none at first)
// and the live replicas' reports, giving at most maxIdentities identities
// per budget a share of their own: those of the highest demand on any one
// replica. For each such identity, with u_r its use of the whole budget on
// replica r and s_r its fraction there in the last allocation (1/N for a
// replica or an identity it did not have):
//
//	want_r = u_r / TargetUse, and at least Grow·s_r when u_r ≥ SaturatedUse·s_r
//	         (the replica is saturated)
//	W = Σ want_r
//	s'_r = want_r / W           when a replica is saturated, or W > 1 (in proportion)
//	s'_r = want_r + (1 − W)/N   otherwise (the rest split evenly, as headroom)
//
// so the fractions always sum to 1; a replica left with 0 still admits one
// watch (see Shares), and its use then grows its fraction.
//
// Two bounds keep an identity within its whole budget while replicas read
// allocations at their own pace. A replica's open watches are not taken
// back when its fraction shrinks, so each replica keeps at least the
// fraction its open watches hold (Demand.Held), and a saturated one that
// holds watches its previous fraction, which it fills before it reads the
// new allocation; the others share only what they leave (keepHeld). And a
// fraction grows only into what the other replicas can no longer admit: a
// replica may enforce any allocation from the one it last applied
// (Report.Applied) to the newest, so until it has applied a shrink it
// counts at its largest fraction among those (growOnlyIntoAcknowledged).
// An identity that moves all its clients to one replica therefore gets its
// whole budget there one allocation after the others applied their
// shrink.
//
// Allocate is pure: the caller sets the pace (every 2 s, like
// KubeGateway's), decides which replicas are live, and keeps the history.
// The result's Generation is one more than the last allocation's.
func Allocate(history []*Allocation, reports []Report, maxIdentities int) *Allocation {
	history = slices.DeleteFunc(slices.Clone(history), func(a *Allocation) bool { return a == nil })
	var prev *Allocation
	if len(history) > 0 {
		prev = history[len(history)-1]
	}
	reports = slices.Clone(reports)
	slices.SortFunc(reports, func(a, b Report) int { return cmp.Compare(a.Replica, b.Replica) })
	reports = slices.CompactFunc(reports, func(a, b Report) bool { return a.Replica == b.Replica })
	next := &Allocation{Replicas: make([]string, len(reports))}
	if prev != nil {
		next.Generation = prev.Generation
	}
	next.Generation++
	for i, r := range reports {
		next.Replicas[i] = r.Replica
	}
	n := len(reports)
	if n == 0 {
		return next
	}
	// The previous fraction of replica next.Replicas[i], for budget and user.
	prevIndex := make([]int, n)
	for i, r := range next.Replicas {
		prevIndex[i] = -1
		if prev != nil {
			if j, ok := slices.BinarySearch(prev.Replicas, r); ok {
				prevIndex[i] = j
			}
		}
	}
	prevShare := func(budget, user string, i int) float64 {
		if prev != nil && prevIndex[i] >= 0 {
			if fs, ok := prev.Budgets[budget][user]; ok && prevIndex[i] < len(fs) {
				return fs[prevIndex[i]]
			}
		}
		return 1 / float64(n)
	}
	// What each replica enforces under each allocation kept, as it
	// enforces it (Shares).
	enforces := make([][]*Shares, len(history))
	for j, h := range history {
		enforces[j] = make([]*Shares, n)
		for i, r := range next.Replicas {
			enforces[j][i], _ = h.Shares(r)
		}
	}
	// The largest fraction replica i may enforce until it reads next;
	// -1 when that is unknown (it reports an allocation older than those
	// kept, or one never written).
	mayEnforce := func(budget, user string, i int) float64 {
		applied := reports[i].Applied
		f := 0.0
		switch {
		case applied <= 0:
			// An even split.
			f = 1 / float64(n)
		case len(history) == 0 || applied < history[0].Generation || applied > history[len(history)-1].Generation:
			// Older than those kept, or one never written (an
			// annotation edited by hand).
			return -1
		}
		for j, h := range history {
			if h.Generation >= applied {
				f = max(f, enforces[j][i].of(budget, user))
			}
		}
		return f
	}

	budgets := map[string]bool{}
	for _, r := range reports {
		for b := range r.Budgets {
			budgets[b] = true
		}
	}
	for _, h := range history {
		for b := range h.Budgets {
			budgets[b] = true
		}
	}
	for _, budget := range slices.Sorted(maps.Keys(budgets)) {
		// Each identity's highest use, to rank them.
		peak := map[string]float64{}
		for _, r := range reports {
			for user, u := range r.Budgets[budget].Identities {
				if u > 0 && !math.IsNaN(u) {
					peak[user] = max(peak[user], u)
				}
			}
		}
		users := slices.Collect(maps.Keys(peak))
		slices.SortFunc(users, func(a, b string) int {
			return cmp.Or(cmp.Compare(peak[b], peak[a]), cmp.Compare(a, b))
		})
		users = users[:min(len(users), max(maxIdentities, 0))]
		// An identity named before keeps a share of its own, whatever
		// its demand, until no replica may enforce more than the even
		// 1/N it would get without one.
		if n > 1 {
			kept := map[string]bool{}
			for _, u := range users {
				kept[u] = true
			}
			for _, h := range history {
				for _, user := range slices.Sorted(maps.Keys(h.Budgets[budget])) {
					if kept[user] {
						continue
					}
					for i := range reports {
						if f := mayEnforce(budget, user, i); f < 0 || f > 1/float64(n)+1e-9 {
							users = append(users, user)
							kept[user] = true
							break
						}
					}
				}
			}
		}
		if len(users) == 0 {
			continue
		}
		ids := make(map[string][]float64, len(users))
		for _, user := range users {
			want := make([]float64, n)
			prevs := make([]float64, n)
			sat := make([]bool, n)
			total, saturated := 0.0, false
			for i, r := range reports {
				u := min(max(r.Budgets[budget].Identities[user], 0), float64(n))
				if math.IsNaN(u) {
					u = 0
				}
				s := prevShare(budget, user, i)
				want[i] = u / TargetUse
				if u > 0 && u >= SaturatedUse*s {
					want[i] = max(want[i], Grow*s)
					saturated, sat[i] = true, true
				}
				prevs[i] = s
				total += want[i]
			}
			fs := make([]float64, n)
			held := make([]float64, n)
			for i, r := range reports {
				if h := r.Budgets[budget].Held[user]; h > 0 && !math.IsNaN(h) {
					held[i] = min(h, 1)
					// Saturated, it fills its previous fraction before
					// it reads this allocation.
					if sat[i] {
						held[i] = max(held[i], prevs[i])
					}
				}
			}
			for i := range want {
				if n == 1 {
					// Exactly the whole, which a sum may miss by a rounding.
					fs[i] = 1
					continue
				}
				if total <= 1 && !saturated {
					fs[i] = want[i] + (1-total)/float64(n)
				} else {
					fs[i] = want[i] / total
				}
			}
			keepHeld(fs, held)
			if n > 1 {
				bound := make([]float64, n)
				for i := range bound {
					if bound[i] = mayEnforce(budget, user, i); bound[i] >= 0 {
						bound[i] = max(bound[i], held[i])
					}
				}
				growOnlyIntoAcknowledged(fs, bound)
			}
			ids[user] = fs
		}
		if next.Budgets == nil {
			next.Budgets = map[string]map[string][]float64{}
		}
		next.Budgets[budget] = ids
	}
	return next
}

// growOnlyIntoAcknowledged lowers the fractions that grow, fs[i] >
// bound[i], so that what all replicas may admit until they read fs — the
// larger of fs[i] and bound[i] on each — sums to at most 1: the growth is
// cut in proportion to fit what the bounds leave, and to nothing when they
// leave nothing. A negative bound is unknown: that replica may admit
// anything until it reads fs, so nobody grows, and its own fraction
// becomes 0, which it surely does not exceed.
func growOnlyIntoAcknowledged(fs, bound []float64) {
	bounded, growth := 0.0, 0.0
	for i := range fs {
		if bound[i] < 0 {
			fs[i], bound[i] = 0, 1
		}
		bounded += bound[i]
		growth += max(fs[i]-bound[i], 0)
	}
	room := max(1-bounded, 0)
	if growth <= room {
		return
	}
	scale := room / growth
	for i := range fs {
		if fs[i] > bound[i] {
			fs[i] = bound[i] + (fs[i]-bound[i])*scale
		}
	}
}

// keepHeld raises each fraction fs[i] to at least held[i], taking what it
// adds from the others' fractions above what they hold, in proportion, so
// that they still sum to at most 1; when the held fractions sum to more
// than 1, each replica keeps its held share of the whole.
func keepHeld(fs, held []float64) {
	h := 0.0
	for _, x := range held {
		h += x
	}
	if h == 0 {
		return
	}
	if h >= 1 {
		for i := range fs {
			fs[i] = held[i] / h
		}
		return
	}
	extra := 0.0
	for i := range fs {
		extra += max(fs[i]-held[i], 0)
	}
	scale := 1.0
	if extra > 1-h {
		scale = (1 - h) / extra
	}
	for i := range fs {
		fs[i] = held[i] + max(fs[i]-held[i], 0)*scale
	}
}
