package ratelimit

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// A watch-list (sendInitialEvents=true) is complete once the API server has
// sent its initial events and the bookmark that ends them (annotation
// k8s.io/initial-events-end). client-go's reflector, when a watch-list
// stream ends without that bookmark, opens the next watch-list at once and
// forever (kubernetes#140890): an aggregated API server that never sends
// the bookmark makes every informer of its resources loop. The engine
// remembers, per identity × (group, resource), watch-lists that ended
// incomplete in a row; at IncompleteWatchListLimit it refuses that
// identity's watch-lists of that resource for IncompleteWatchListHold with
// ReasonWatchListIncomplete, which the proxy answers as an API server
// without watch-list support does, so that client-go falls back to a LIST
// and a WATCH from its version, which such a server serves.
const (
	// IncompleteWatchListLimit is how many watch-lists in a row of one
	// identity for one resource may end without their initial-events-end
	// bookmark before its watch-lists of that resource are refused.
	IncompleteWatchListLimit = 3
	// IncompleteWatchListHold is how long they are then refused. After it,
	// IncompleteWatchListLimit more are forwarded before the next refusal:
	// a resource whose server never completes a watch-list costs the API
	// server at most 3 watch-lists per identity every 10 minutes.
	IncompleteWatchListHold = 10 * time.Minute
)

// Bounds of the incomplete-watch-list memory: at most
// maxWatchListIdentities identities, each with at most
// watchListResourcesPerIdentity resources (about 256 bytes an identity,
// 4 MiB at the cap). An identity beyond the cap is not remembered: its
// watch-lists are forwarded, as without watchgate. Within an identity, a
// new resource replaces the one with the fewest misses that is not refused.
const (
	maxWatchListIdentities        = 1 << 14
	watchListResourcesPerIdentity = 8
	watchListShards               = 16
)

// watchListMemory is the engine's memory of incomplete watch-lists. Its
// keys are 64-bit hashes under secret per-engine seeds: never a client's
// strings.
type watchListMemory struct {
	userSeed, resourceSeed maphash.Seed
	// tracked counts the identities remembered, so that an engine that
	// never saw an incomplete watch-list skips the lookups.
	tracked atomic.Int64
	shards  [watchListShards]watchListShard
}

type watchListShard struct {
	mu  sync.Mutex
	ids map[uint64]*watchListIdentity // by user hash; guarded by mu
}

// watchListIdentity is one identity's resources with incomplete
// watch-lists.
type watchListIdentity struct {
	res [watchListResourcesPerIdentity]watchListEntry
}

type watchListEntry struct {
	resource uint64 // hash of group/resource; 0: free
	misses   int32  // incomplete watch-lists in a row
	until    int64  // UnixNano the refusal ends; 0: not refused
	at       int64  // UnixNano last changed
}

func (m *watchListMemory) init() {
	m.userSeed, m.resourceSeed = maphash.MakeSeed(), maphash.MakeSeed()
	for i := range m.shards {
		m.shards[i].ids = map[uint64]*watchListIdentity{}
	}
}

func (m *watchListMemory) keys(user, group, resource string) (*watchListShard, uint64, uint64) {
	u := maphash.String(m.userSeed, user)
	var h maphash.Hash
	h.SetSeed(m.resourceSeed)
	h.WriteString(group)
	h.WriteByte('/')
	h.WriteString(resource)
	return &m.shards[u%watchListShards], u, h.Sum64() | 1
}

// find returns the entry of resource, or nil.
func (id *watchListIdentity) find(resource uint64) *watchListEntry {
	for i := range id.res {
		if id.res[i].resource == resource {
			return &id.res[i]
		}
	}
	return nil
}

func (id *watchListIdentity) empty() bool {
	for i := range id.res {
		if id.res[i].resource != 0 {
			return false
		}
	}
	return true
}

// isWatchList reports whether r is a watch-list: a watch with
// sendInitialEvents=true.
func (r *Request) isWatchList() bool {
	return r.Verb == VerbWatch && r.SendInitialEvents != nil && *r.SendInitialEvents
}

// decide returns, for a watch-list r of user (the identity's name as the
// engine keeps it) at now (UnixNano), how long its identity's watch-lists of its resource are still refused (0: not
// refused). A watch from a version (no initial state) of the resource
// means its client has synced, by whatever path: the misses in a row start
// again from 0.
func (m *watchListMemory) decide(now int64, r *Request, user string) time.Duration {
	watchList := r.isWatchList()
	if !watchList && r.initialState() {
		return 0
	}
	sh, u, res := m.keys(user, r.Group, r.Resource)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	id := sh.ids[u]
	if id == nil {
		return 0
	}
	e := id.find(res)
	if e == nil {
		return 0
	}
	if watchList {
		if e.until > now {
			return time.Duration(e.until - now)
		}
		return 0
	}
	e.misses = 0
	if e.until <= now {
		*e = watchListEntry{}
		m.dropIfEmpty(sh, u, id)
	}
	return 0
}

// watchListHeld is watchLists.decide for r at now (UnixNano). Decide calls
// it only while some identity has an incomplete watch-list (tracked > 0):
// otherwise a watch costs one atomic load here.
func (e *Engine) watchListHeld(now int64, r *Request) time.Duration {
	return e.watchLists.decide(now, r, e.userKey(r.User))
}

// ended records how a forwarded watch-list of user's (group, resource)
// ended at now: complete (its initial-events-end bookmark went by) or not.
func (m *watchListMemory) ended(now int64, user, group, resource string, complete bool) {
	if complete && m.tracked.Load() == 0 {
		return
	}
	sh, u, res := m.keys(user, group, resource)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	id := sh.ids[u]
	if complete {
		if id == nil {
			return
		}
		if e := id.find(res); e != nil && e.until <= now {
			*e = watchListEntry{}
			m.dropIfEmpty(sh, u, id)
		} else if e != nil {
			e.misses = 0
		}
		return
	}
	if id == nil {
		if m.tracked.Load() >= maxWatchListIdentities {
			return
		}
		id = &watchListIdentity{}
		sh.ids[u] = id
		m.tracked.Add(1)
	}
	e := id.find(res)
	if e == nil {
		e = id.slotFor(now)
		if e == nil {
			return // every resource of the identity is refused
		}
		*e = watchListEntry{resource: res}
	}
	e.at = now
	if e.until > now {
		return // forwarded before the refusal began
	}
	if e.misses++; e.misses >= IncompleteWatchListLimit {
		e.misses, e.until = 0, now+int64(IncompleteWatchListHold)
	}
}

// slotFor returns a free entry, or the one with the fewest misses that is
// not refused at now; nil when all are refused.
func (id *watchListIdentity) slotFor(now int64) *watchListEntry {
	var best *watchListEntry
	for i := range id.res {
		e := &id.res[i]
		switch {
		case e.resource == 0:
			return e
		case e.until > now:
		case best == nil || e.misses < best.misses:
			best = e
		}
	}
	return best
}

// dropIfEmpty forgets id when it holds no resource. sh.mu is held.
func (m *watchListMemory) dropIfEmpty(sh *watchListShard, u uint64, id *watchListIdentity) {
	if id.empty() {
		delete(sh.ids, u)
		m.tracked.Add(-1)
	}
}

// sweep forgets entries whose refusal is over and that have not changed
// for idle, and the identities left with none; it returns how many
// entries it forgot.
func (m *watchListMemory) sweep(now int64, idle time.Duration) int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for u, id := range sh.ids {
			for j := range id.res {
				if e := &id.res[j]; e.resource != 0 && e.until <= now && now-e.at >= int64(idle) {
					*e = watchListEntry{}
					n++
				}
			}
			m.dropIfEmpty(sh, u, id)
		}
		sh.mu.Unlock()
	}
	return n
}

// WatchListEnded tells the engine how an admitted watch-list
// (sendInitialEvents=true) ended: complete when the API server sent the
// bookmark that ends its initial events, incomplete when its stream ended
// (the API server closed it, or it broke) without it. A watch-list its
// client or the proxy cut, or whose stream could not be read, should not
// be reported. Call it before WatchEnded releases w; the zero Watch, or
// one already released, is ignored.
//
// IncompleteWatchListLimit incomplete watch-lists in a row of one identity
// for one (group, resource) make Decide refuse its watch-lists of that
// resource with ReasonWatchListIncomplete for IncompleteWatchListHold. A
// complete watch-list, or a watch of the resource from a version (which
// client-go opens only once its cache is synced), starts the count again.
func (e *Engine) WatchListEnded(now time.Time, w Watch, complete bool) {
	s := w.slot
	if s == nil || s.gen.Load() != w.gen {
		return
	}
	e.watchLists.ended(now.UnixNano(), s.user, s.req.group, s.req.resource, complete)
}
