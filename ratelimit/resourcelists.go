package ratelimit

import (
	"hash/maphash"
	"time"
)

// A rebuild is what a client sends to fill its cache of one resource from
// scratch: a LIST (its first page: the pages that continue it are part of
// the same rebuild) or a watch that asks for initial state (a watch-list,
// or a watch from version "" or "0"). An agent that resets its caches
// every few seconds (a schema reset, a failing watch) rebuilds one
// resource again and again; Limits.ListsPerMinutePerResource gives each
// identity a bucket per (group, resource) for its rebuilds, so that one
// resource's loop runs out of its own tokens and not the identity's list
// or watch tokens that its other resources need.

// resourceListSlots is how many resources an identity keeps a rebuild
// bucket for. A bucket that is full carries no state (a new one starts
// full), so a new resource takes the slot of a full one; when all are
// partly spent, the identity's further resources share its overflow
// bucket: limited together, never unlimited. An identity that rebuilds
// takes about 350 bytes more (8 buckets of 40 bytes and the overflow bucket).
const resourceListSlots = 8

// resourceLists are an identity's rebuild buckets, one per (group,
// resource), nil until it rebuilds under a budget with
// ListsPerMinutePerResource. Guarded by the identity's shard lock.
type resourceLists struct {
	slots    [resourceListSlots]resourceList
	overflow bucket
}

type resourceList struct {
	resource uint64 // hash of group/resource; 0: free
	b        bucket
}

// isRebuild reports whether r rebuilds a client's cache of its resource.
func (r *Request) isRebuild() bool {
	switch r.Verb {
	case VerbList:
		return !r.Continuation
	case VerbWatch:
		return r.initialState()
	}
	return false
}

// rebuildBucket returns the bucket that r, a request by id at now
// (UnixNano) under cfg, is charged to for its resource, or nil when r is
// not a rebuild or cfg has no ListsPerMinutePerResource. It may take the
// slot of a full bucket; it takes no token. id.sh.mu is held.
func (e *Engine) rebuildBucket(id *identity, now int64, r *Request, cfg *Budget) *bucket {
	l := &cfg.Limits
	if l.ListsPerMinutePerResource <= 0 || !r.isRebuild() {
		return nil
	}
	f := e.shares.Load().shares.of(cfg.Name, id.user)
	perSecond, burst := float64(l.ListsPerMinutePerResource)*min(f, 1)/60, int(scaleCount(l.ListBurstPerResource, f))
	if perSecond <= 0 {
		return nil
	}
	if id.resLists == nil {
		id.resLists = &resourceLists{overflow: newBucket(now, perSecond, burst)}
	}
	rl := id.resLists
	res := e.resourceHash(r.Group, r.Resource)
	var free *resourceList
	for i := range rl.slots {
		s := &rl.slots[i]
		if s.resource == res {
			return rebucketed(&s.b, now, perSecond, burst)
		}
		if free == nil && (s.resource == 0 || s.b.tokensAt(now) >= float64(s.b.burst)) {
			free = s
		}
	}
	if free == nil {
		return rebucketed(&rl.overflow, now, perSecond, burst)
	}
	*free = resourceList{resource: res, b: newBucket(now, perSecond, burst)}
	return &free.b
}

// rebucketed makes b follow the budget's current rate and burst, keeping
// its tokens, and returns it.
func rebucketed(b *bucket, now int64, perSecond float64, burst int) *bucket {
	if b.limit != perSecond {
		b.setLimitAt(now, perSecond)
	}
	if b.burst != burst {
		b.setBurstAt(now, burst)
	}
	return b
}

// resourceHash is the hash of group/resource under the engine's seed.
func (e *Engine) resourceHash(group, resource string) uint64 {
	var h maphash.Hash
	h.SetSeed(e.seeds[0])
	h.WriteString(group)
	h.WriteByte('/')
	h.WriteString(resource)
	return h.Sum64() | 1
}

// checkRebuild rejects r when its resource's rebuild bucket (b, nil: none)
// lacks a token; it takes none.
func checkRebuild(b *bucket, now int64) (Reason, time.Duration) {
	if b != nil && b.tokensAt(now) < 1 {
		return ReasonResourceListsLimited, tokenWait(b, now, 1)
	}
	return ReasonNone, 0
}

// takeRebuild takes r's token from b (nil: none), once every other check
// has passed.
func takeRebuild(b *bucket, now int64) {
	if b != nil {
		b.allowN(now, 1)
	}
}

// full reports whether none of the identity's rebuild buckets is
// partly spent at now: dropping them would change no decision.
func (rl *resourceLists) full(now time.Time) bool {
	if rl == nil {
		return true
	}
	for i := range rl.slots {
		if s := &rl.slots[i]; s.resource != 0 && !full(&s.b, now) {
			return false
		}
	}
	return full(&rl.overflow, now)
}

// checkList runs the checks on a list at now (UnixNano), in order, and
// takes its tokens when they all pass: its resource's rebuild bucket
// (ListsPerMinutePerResource), then the identity's list bucket
// (ListsPerMinute). id.sh.mu is held.
func (e *Engine) checkList(id *identity, now int64, r *Request, cfg *Budget) (Reason, time.Duration) {
	rb := e.rebuildBucket(id, now, r, cfg)
	if reason, d := checkRebuild(rb, now); reason != ReasonNone {
		return reason, d
	}
	if id.list.limited() && !id.list.allowN(now, 1) {
		return ReasonRateLimited, tokenWait(&id.list, now, 1)
	}
	takeRebuild(rb, now)
	return ReasonNone, 0
}
