package ratelimit

import (
	"cmp"
	"math"
	"time"
)

// sharesGen is a Shares with the generation SetShares gave it; identities
// configured under an older generation are reconfigured.
type sharesGen struct {
	shares *Shares
	gen    uint32
}

// SetShares makes s the fractions of the budgets this replica enforces (see
// Shares; nil is every budget whole). Every identity's buckets and cap are
// reconfigured at now as by a budget edit: tokens they hold are kept (up to
// the new burst), open watches stay open, and a cap now below them admits no
// new watch until enough end.
func (e *Engine) SetShares(now time.Time, s *Shares) {
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	e.shares.Store(&sharesGen{shares: s, gen: e.shares.Load().gen + 1})
	for _, bs := range e.current.Load().states {
		e.reconfigure(bs, now)
	}
}

// Shares returns the fractions set by SetShares; nil is every budget whole.
func (e *Engine) Shares() *Shares { return e.shares.Load().shares }

// Demand returns, by budget name, at most n of each budget's tracked
// identities (Exempt budgets and the overflow identity left out) that
// used any of it since the previous call, ranked by their use of the whole
// budget, most first: the largest of
//
//	(open watches + watches refused for the cap) / MaxConcurrentWatches
//	watches asked for / (WatchOpensPerMinute · minutes since the previous call)
//
// An identity held back by its share thus shows more use than the share,
// which is what makes an allocation (Allocate) grow it. Demand.Held is
// the first term's open watches alone. Each call starts
// the next period: there is one caller, the replica's reporter. Like Top,
// it takes each shard's lock in turn.
func (e *Engine) Demand(now time.Time, n int) map[string]Demand {
	e.demandMu.Lock()
	defer e.demandMu.Unlock()
	minutes := now.Sub(e.demandAt).Minutes()
	if e.demandAt.IsZero() {
		minutes = 0
	}
	e.demandAt = now
	type used struct {
		user      string
		use, held float64
	}
	rank := func(a, b used) int { return cmp.Or(cmp.Compare(b.use, a.use), cmp.Compare(a.user, b.user)) }
	out := make(map[string]Demand)
	for _, bs := range e.current.Load().states {
		cfg := bs.cfg.Load()
		if cfg.Enforcement == Exempt {
			continue
		}
		l := &cfg.Limits
		var top []used
		for i := range bs.shards {
			sh := &bs.shards[i]
			sh.mu.Lock()
			sh.each(func(id *identity) {
				u, held := 0.0, 0.0
				if l.MaxConcurrentWatches > 0 {
					held = float64(id.open) / float64(l.MaxConcurrentWatches)
					u = held + float64(id.capped)/float64(l.MaxConcurrentWatches)
				}
				if l.WatchOpensPerMinute > 0 && minutes > 0 {
					u = max(u, float64(id.asked)/(float64(l.WatchOpensPerMinute)*minutes))
				}
				id.asked, id.capped = 0, 0
				if u > 0 && !math.IsInf(u, 0) {
					top = insertRanked(top, used{id.user, u, held}, n, rank)
				}
			})
			sh.mu.Unlock()
		}
		if len(top) == 0 {
			continue
		}
		d := Demand{Identities: make(map[string]float64, len(top))}
		for _, t := range top {
			d.Identities[t.user] = t.use
			if t.held > 0 {
				if d.Held == nil {
					d.Held = make(map[string]float64)
				}
				d.Held[t.user] = t.held
			}
		}
		out[bs.name] = d
	}
	return out
}

// saturatingInc is n+1, or n at its maximum.
func saturatingInc(n uint32) uint32 {
	if n == math.MaxUint32 {
		return n
	}
	return n + 1
}
