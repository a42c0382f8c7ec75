package ratelimit

import "time"

// Sweep evicts state that no longer changes any decision, and returns how
// many keys it evicted. Call it periodically (the proxy does every 30s);
// memory stays bounded by Options.MaxTrackedKeys regardless.
//
// An identity is evicted when it holds no open watch and no backoff, its
// buckets are full and it was last active at least Options.IdleAfter ago: it
// is then indistinguishable from a new identity, so dropping it changes no
// decision (only its rejection count, see Stats, is lost; its observed
// peaks are kept in its budget's sketch). A backoff key
// is evicted IdleAfter after its delay expired (and not within a minute of
// its last stale answer): a key that has not failed for that long starts
// again from Backoff.Initial, as if a watch had lived past ResetAfter. Stale versions are forgotten after the longest
// StaleVersions.Memory in the policy.
//
// Sweep takes each shard's lock in turn, never all at once.
func (e *Engine) Sweep(now time.Time) (evicted int) {
	a := e.current.Load()
	ns := now.UnixNano()
	idleAfter := e.opts.IdleAfter
	var retired ObservedPeaks
	for _, bs := range a.states {
		retired = ObservedPeaks{}
		for i := range bs.shards {
			sh := &bs.shards[i]
			sh.mu.Lock()
			n := sh.evict(func(id *identity) bool {
				evicted += e.sweepBackoff(id, ns)
				if !id.idle(now, idleAfter) {
					return false
				}
				retired.add(&id.obs.peak)
				return true
			})
			e.identities.give(n)
			evicted += n
			sh.mu.Unlock()
		}
		bs.retire(&retired)
		sh := &bs.overflow
		sh.mu.Lock()
		evicted += e.sweepBackoff(sh.spill, ns)
		sh.mu.Unlock()
		for i := range bs.aggregates {
			sh := &bs.aggregates[i]
			sh.mu.Lock()
			n := sh.evict(func(id *identity) bool { return id.idle(now, idleAfter) })
			e.identities.give(n)
			evicted += n
			sh.mu.Unlock()
		}
	}
	e.swapMu.Lock()
	e.dropOrphans()
	e.swapMu.Unlock()
	return evicted + e.stale.sweep(now, a.policy.longestStaleMemory) + e.watchLists.sweep(ns, idleAfter)
}

// sweepBackoff evicts the identity's backoff keys whose delay expired at
// least IdleAfter ago and whose last stale answer is older than
// staleRepeatWindow, and returns how many. id.sh.mu is held.
func (e *Engine) sweepBackoff(id *identity, ns int64) (evicted int) {
	for k, st := range id.backoff {
		if ns-st.until >= int64(e.opts.IdleAfter) && ns-st.staleAt >= int64(staleRepeatWindow) {
			e.forget(id, k)
			evicted++
		}
	}
	return evicted
}
