package ratelimit

import "cmp"

// BudgetStats are one budget's live figures, for its status.
type BudgetStats struct {
	// ActiveWatches is the number of admitted watches not yet released.
	ActiveWatches int64
	// TrackedIdentities is the number of identities with state (the shared
	// overflow identity not included).
	TrackedIdentities int64
	// Decisions counts decisions by Reason since the budget appeared; those
	// with no Reason are counted under ReasonAllowed. DryRun decisions count
	// under the Reason they would have had.
	Decisions map[Reason]int64
	// TopOffenders are up to 5 tracked identities with the most rejections
	// (or DryRun would-be rejections), most first, ties by user. An
	// identity evicted by Sweep is forgotten.
	TopOffenders []Offender
	// Observed sketches the peaks of the identities the budget governed
	// (see ObservedPeaks); empty for an Exempt budget.
	Observed ObservedPeaks
}

// Offender is an identity and its rejections. User is the name as the
// engine keeps it: a name longer than 512 bytes is cut, with a hash
// appended.
type Offender struct {
	User       string
	Rejections int64
}

const topOffenders = 5

// Stats returns the figures of every budget in the current policy, by
// name. It takes each shard's lock in turn; call it every few seconds, not
// per request.
func (e *Engine) Stats() map[string]BudgetStats {
	a := e.current.Load()
	out := make(map[string]BudgetStats, len(a.states))
	for _, bs := range a.states {
		st := BudgetStats{Decisions: make(map[Reason]int64, numReasons)}
		var counts [numReasons]int64
		for i := range bs.shards {
			sh := &bs.shards[i]
			sh.mu.Lock()
			st.ActiveWatches += sh.open
			st.TrackedIdentities += int64(sh.tracked)
			for j := range counts {
				counts[j] += sh.decisions[j]
			}
			counts[idxAllowed] += sh.exempt.Load()
			sh.each(func(id *identity) {
				if id.rejections > 0 {
					st.TopOffenders = addOffender(st.TopOffenders, Offender{id.user, id.rejections})
				}
			})
			sh.mu.Unlock()
		}
		// Aggregates count only their rejections: every watch they admit
		// is counted by the identity it is charged to.
		for i := range bs.aggregates {
			sh := &bs.aggregates[i]
			sh.mu.Lock()
			counts[idxAggregateLimited] += sh.decisions[idxAggregateLimited]
			sh.mu.Unlock()
		}
		bs.aggregateOverflow.mu.Lock()
		counts[idxAggregateLimited] += bs.aggregateOverflow.decisions[idxAggregateLimited]
		bs.aggregateOverflow.mu.Unlock()
		sh := &bs.overflow
		sh.mu.Lock()
		st.ActiveWatches += sh.open
		for j := range counts {
			counts[j] += sh.decisions[j]
			st.Decisions[reasonsByIndex[j]] = counts[j]
		}
		sh.mu.Unlock()
		if bs.cfg.Load().Enforcement != Exempt {
			st.Observed = bs.observed()
		}
		out[bs.name] = st
	}
	return out
}

// addOffender keeps top sorted and at most topOffenders long.
func addOffender(top []Offender, o Offender) []Offender {
	return insertRanked(top, o, topOffenders, func(a, b Offender) int {
		return cmp.Or(cmp.Compare(b.Rejections, a.Rejections), cmp.Compare(a.User, b.User))
	})
}
