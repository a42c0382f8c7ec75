package ratelimit

import (
	"hash/maphash"
	"time"
)

// regovern moves every open watch of bs's identities whose governing
// budget in next is another (tracked) budget to its identity there, with
// its count: an open watch counts against the budget that governs it now
// (see SetPolicy). It runs under swapMu, after next is current, and is
// the only code that holds two shard locks at once (a watch's shard and
// its new one, never the same lock), so no lock order can be broken.
func (e *Engine) regovern(next *enforced, bs *budgetState, now time.Time) {
	move := func(id *identity) {
		for s := id.watches; s != nil; {
			following := s.next
			e.moveWatch(next, bs, id, s, now)
			s = following
		}
	}
	for i := range bs.shards {
		sh := &bs.shards[i]
		sh.mu.Lock()
		sh.each(move)
		sh.mu.Unlock()
	}
	bs.overflow.mu.Lock()
	move(bs.overflow.spill)
	bs.overflow.mu.Unlock()
}

// moveWatch moves s, an open watch of id under bs, to the budget that
// governs it in next, when that is another budget that tracks watches.
// id.sh.mu is held.
func (e *Engine) moveWatch(next *enforced, bs *budgetState, id *identity, s *slot, now time.Time) {
	j := next.policy.matchRequest(s.user, s.groups, s.req.group, s.req.resource, s.req.namespace, s.impersonated)
	if j < 0 {
		return
	}
	to := next.states[j]
	if to == bs || to.cfg.Load().Enforcement == Exempt {
		return
	}
	h := maphash.String(e.userSeed, s.user)
	target := e.lockedIdentity(to.shardFor(h), &to.overflow, h, e.userKey(s.user))
	id.unlink(s)
	id.open--
	id.sh.open--
	target.link(s)
	target.open++
	target.sh.open++
	target.touch(now.UnixNano())
	target.sh.mu.Unlock()
}
