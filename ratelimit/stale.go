package ratelimit

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxStaleVersions caps the stale-version memory. At the cap a new
	// stale version is not remembered: the watch that asks for it goes to
	// the API server, which answers 410 itself (fail open, correct, just
	// not saved).
	maxStaleVersions = 1 << 16
	numStaleShards   = 16
)

// staleMemory remembers the resourceVersions the API server declared too
// old, per (group, resource), and when. How long a version counts as stale
// is each budget's StaleVersions.Memory; Sweep forgets versions older than
// the longest Memory in the policy.
type staleMemory struct {
	seed   maphash.Seed
	count  atomic.Int64
	shards [numStaleShards]staleShard
}

type staleShard struct {
	// n is len(seen), readable without the lock: most shards hold no
	// stale version most of the time, and then a lookup takes no lock.
	n  atomic.Int32
	mu sync.RWMutex
	// seen is when each version was last reported stale, UnixNano.
	seen map[staleKey]int64 // guarded by mu
	_    [64]byte
}

type staleKey struct {
	group, resource, resourceVersion string
}

func (m *staleMemory) init() {
	m.seed = maphash.MakeSeed()
	for i := range m.shards {
		m.shards[i].seen = make(map[staleKey]int64)
	}
}

func (m *staleMemory) shard(rv string) *staleShard {
	return &m.shards[maphash.String(m.seed, rv)%numStaleShards]
}

// StaleVersionSeen tells the engine that the API server answered a watch
// on group/resource at resourceVersion with 410 Expired ("too old resource
// version"). For each budget's StaleVersions.Memory after now, a watch
// governed by a budget with StaleReject that asks for that version is
// rejected with ReasonStaleResourceVersion without reaching the server.
// An empty resourceVersion or "0" is ignored (those are never too old).
func (e *Engine) StaleVersionSeen(now time.Time, group, resource, resourceVersion string) {
	if resourceVersion == "" || resourceVersion == "0" {
		return
	}
	k := staleKey{group, resource, resourceVersion}
	sh := e.stale.shard(resourceVersion)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.seen[k]; !ok {
		if e.stale.count.Add(1) > maxStaleVersions {
			e.stale.count.Add(-1)
			return
		}
		k = staleKey{strings.Clone(group), strings.Clone(resource), strings.Clone(resourceVersion)}
		sh.n.Add(1)
	}
	sh.seen[k] = max(sh.seen[k], now.UnixNano())
}

// has reports whether rv was seen stale within memory before now.
func (m *staleMemory) has(now time.Time, group, resource, rv string, memory time.Duration) bool {
	if memory <= 0 || rv == "" || rv == "0" || m.count.Load() == 0 {
		return false
	}
	sh := m.shard(rv)
	if sh.n.Load() == 0 {
		return false
	}
	sh.mu.RLock()
	seen, ok := sh.seen[staleKey{group, resource, rv}]
	sh.mu.RUnlock()
	return ok && now.UnixNano()-seen < int64(memory)
}

// sweep forgets versions seen at least memory before now, and returns how
// many.
func (m *staleMemory) sweep(now time.Time, memory time.Duration) (evicted int) {
	ns := now.UnixNano()
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, seen := range sh.seen {
			if ns-seen >= int64(memory) {
				delete(sh.seen, k)
				sh.n.Add(-1)
				evicted++
			}
		}
		sh.mu.Unlock()
	}
	m.count.Add(-int64(evicted))
	return evicted
}
