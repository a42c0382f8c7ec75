package ratelimit

import (
	"cmp"
	"slices"
)

// TopOrder is the figure Top ranks identities by.
type TopOrder int

const (
	// ByRejections ranks by rejections (DryRun's would-be rejections
	// included).
	ByRejections TopOrder = iota
	// ByOpens ranks by watches admitted.
	ByOpens
	// ByWatches ranks by watches open now.
	ByWatches
)

// MaxTop bounds the identities Top returns per budget.
const MaxTop = 100

// IdentityFigures are one tracked identity's figures under one budget.
// User is the name as the engine keeps it (see Offender).
type IdentityFigures struct {
	User string
	// Rejections counts its decisions with a Reason, DryRun's included.
	Rejections int64
	// Opens counts the watches it was admitted (in DryRun also those it
	// would have been refused) since the engine began tracking it.
	Opens int64
	// Watches is the number of its admitted watches not yet released.
	Watches int64
}

// figure is the figure o ranks by.
func (f *IdentityFigures) figure(o TopOrder) int64 {
	switch o {
	case ByOpens:
		return f.Opens
	case ByWatches:
		return f.Watches
	default:
		return f.Rejections
	}
}

// Top returns, by budget name, up to n (at most MaxTop) of the budget's
// tracked identities whose figure by is not zero, ranked by it, most
// first, ties by user: of the budget named budget, or of every budget of
// the current policy when budget is empty. Identities that share a
// budget's overflow identity, or that Sweep evicted, are not listed.
//
// Like Stats it takes each shard's lock in turn and visits every tracked
// identity of the budgets asked for, so it is an on-demand read for an
// operator, not something to call per request; Decide pays only the
// saturating count of opens.
func (e *Engine) Top(budget string, by TopOrder, n int) map[string][]IdentityFigures {
	n = min(max(n, 0), MaxTop)
	a := e.current.Load()
	out := make(map[string][]IdentityFigures)
	for _, bs := range a.states {
		if budget != "" && bs.name != budget {
			continue
		}
		var top []IdentityFigures
		for i := range bs.shards {
			sh := &bs.shards[i]
			sh.mu.Lock()
			sh.each(func(id *identity) {
				f := IdentityFigures{User: id.user, Rejections: id.rejections, Opens: int64(id.opens), Watches: int64(id.open)}
				if f.figure(by) > 0 {
					top = insertRanked(top, f, n, func(a, b IdentityFigures) int {
						return cmp.Or(cmp.Compare(b.figure(by), a.figure(by)), cmp.Compare(a.User, b.User))
					})
				}
			})
			sh.mu.Unlock()
		}
		out[bs.name] = top
	}
	return out
}

// insertRanked inserts x into top, sorted by rank, and keeps at most n.
func insertRanked[T any](top []T, x T, n int, rank func(a, b T) int) []T {
	i, _ := slices.BinarySearchFunc(top, x, rank)
	if i >= n {
		return top
	}
	top = slices.Insert(top, i, x)
	if len(top) > n {
		top = top[:n]
	}
	return top
}
