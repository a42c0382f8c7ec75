package proxy

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/watchgate/watchgate/ratelimit"
)

// Bounds of pendingVersions; see there.
const (
	// maxPendingVersions caps the versions asked about at once.
	maxPendingVersions = 4096
	// maxPendingVersionBytes caps the bytes of their keys (group and
	// resource names as sent, plus a fixed overhead per entry).
	maxPendingVersionBytes = 1 << 20
	pendingVersionOverhead = 128
	// pendingVersionWait is the longest a twin waits for the first
	// watch's verdict before it goes its own way.
	pendingVersionWait = 5 * time.Second
	// maxPendingVersionFirsts is how many firsts a twin waits for: the
	// one it found and one that took its place. Firsts come and go at a
	// caller's will (a watch dropped before its answer, one rejected by
	// its budget), so without a bound a caller that keeps opening and
	// dropping watches from the version others wait on could hold them
	// for all of pendingVersionWait.
	maxPendingVersionFirsts = 2
	// pendingVersionQuietWindow is the shortest time after the first
	// watch's 200 without an ERROR event that its version counts as valid.
	// kube-apiserver writes the ERROR event of a too old version right
	// behind the headers from its watch cache, but without the cache (or
	// under load) only after a round trip to etcd: a 410 that comes later
	// than the window lets the twins through, one upstream WATCH each. So
	// the window also grows to twice the slowest such gap seen so far
	// (pendingVersions.window), at most maxPendingVersionQuietWindow.
	// Twins of a valid version wait this long only while their stream is
	// quiet: the first event ends the wait.
	pendingVersionQuietWindow    = 250 * time.Millisecond
	maxPendingVersionQuietWindow = time.Second
)

// versionKey is what a resourceVersion's verdict is about: the version
// parsed as kube-apiserver parses it (decimal, so "007" is 7), never the
// string as sent.
type versionKey struct {
	group, resource string
	version         uint64
}

// pendingVersionKey returns the key of a watch from an explicit
// resourceVersion, or false for versions that are never too old ("" and
// "0") or that the proxy cannot parse (those are not held).
func pendingVersionKey(c *classification) (versionKey, bool) {
	if c.Verb != ratelimit.VerbWatch || c.ResourceVersion == "" || c.ResourceVersion == "0" {
		return versionKey{}, false
	}
	v, err := strconv.ParseUint(c.ResourceVersion, 10, 64)
	if err != nil || v == 0 {
		return versionKey{}, false
	}
	return versionKey{group: c.APIGroup, resource: c.Resource, version: v}, true
}

// pendingVersions makes concurrent watches from one resourceVersion ask
// the API server once. The first watch from a (group, resource, version)
// goes on and carries a pendingVersion; its twins that come while the
// verdict is unknown wait (hold), then are decided again: by then the
// engine has learnt the version stale (an ERROR 410 went by) and answers
// them locally, or the version proved valid and they all go upstream.
//
// The verdict is valid as soon as the first watch saw an event that is not
// an ERROR, or its 200 stayed quiet for pendingVersionQuietWindow, and
// stale when an ERROR 410 went by (settle). When the first watch learns
// nothing (its client left, it was rejected, the API server answered
// another status code, an error other than 410, or nothing at all), its
// twins ask again (abandon): one of them takes its place as the first and
// the others wait for that one, so a client that opens a watch from a
// stale version and drops it at once does not let every twin through. A
// watch never waits for a first whose client has already left: that watch
// can teach nothing more, so the newcomer takes its place (a client that
// closes each watch and opens the next from the same version, as
// benchmarks and some dashboards do, would otherwise wait for the
// previous watch's handler to unwind). A twin waits for two firsts
// (maxPendingVersionFirsts) and pendingVersionWait at most, then goes its
// own way.
//
// State is bounded in count (maxPendingVersions) and bytes
// (maxPendingVersionBytes); when full, watches are not held. It is safe for
// concurrent use.
type pendingVersions struct {
	mu    sync.Mutex
	m     map[versionKey]*pendingVersion
	bytes int
	// slowestStale is the longest gap seen between a watch's 200 and its
	// ERROR 410 event, in nanoseconds.
	slowestStale atomic.Int64
}

// observeStale records the gap between a watch's 200 and its ERROR 410.
func (p *pendingVersions) observeStale(gap time.Duration) {
	for {
		old := p.slowestStale.Load()
		if int64(gap) <= old || p.slowestStale.CompareAndSwap(old, int64(gap)) {
			return
		}
	}
}

// window is how long a first watch's quiet 200 must stay quiet before its
// version counts as valid: twice the slowest 410 gap seen, within
// [floor, maxPendingVersionQuietWindow].
func (p *pendingVersions) window(floor time.Duration) time.Duration {
	return min(max(floor, 2*time.Duration(p.slowestStale.Load())), max(floor, maxPendingVersionQuietWindow))
}

// pendingVersion is one version asked about; settle or abandon releases
// its twins.
type pendingVersion struct {
	owner *pendingVersions
	key   versionKey
	// asker is the first watch's request context: once it is done, the
	// first watch will not learn anything more.
	asker    context.Context
	done     chan struct{}
	once     sync.Once
	resolved atomic.Bool
	// settled is set before done closes when the first watch learnt the
	// verdict; otherwise its twins ask again.
	settled atomic.Bool
}

func newPendingVersions() *pendingVersions {
	return &pendingVersions{m: map[versionKey]*pendingVersion{}}
}

func versionKeyBytes(k versionKey) int {
	return len(k.group) + len(k.resource) + pendingVersionOverhead
}

// join returns the pendingVersion to carry when this watch (whose request
// context is ctx) is the first from key, or the one to wait for when
// another watch is asking; both nil when the table is full.
func (p *pendingVersions) join(ctx context.Context, k versionKey) (first, wait *pendingVersion) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.joinLocked(ctx, k)
}

// joinLocked is join; p.mu must be held.
func (p *pendingVersions) joinLocked(ctx context.Context, k versionKey) (first, wait *pendingVersion) {
	if pv, ok := p.m[k]; ok {
		if pv.asker.Err() == nil {
			return nil, pv
		}
		// Its client left: release its twins now and take its place.
		p.forgetLocked(pv)
		pv.release()
	}
	n := versionKeyBytes(k)
	if len(p.m) >= maxPendingVersions || p.bytes+n > maxPendingVersionBytes {
		return nil, nil
	}
	pv := &pendingVersion{owner: p, key: k, asker: ctx, done: make(chan struct{})}
	p.m[k] = pv
	p.bytes += n
	return pv, nil
}

// settle ends the wait of pv's twins with a verdict: the version is
// valid, or the engine has learnt it stale. Only the first settle or
// abandon does anything (the first watch settles on every event of its
// stream, so later calls must not take the table's lock).
func (pv *pendingVersion) settle() { pv.resolve(true) }

// abandon ends the wait of pv's twins without a verdict: they ask again.
// After settle, it does nothing.
func (pv *pendingVersion) abandon() { pv.resolve(false) }

func (pv *pendingVersion) resolve(settled bool) {
	if pv.resolved.Swap(true) {
		return
	}
	p := pv.owner
	p.mu.Lock()
	p.forgetLocked(pv)
	p.mu.Unlock()
	if settled {
		pv.settled.Store(true)
	}
	pv.release()
}

// release closes pv.done once; it takes no lock.
func (pv *pendingVersion) release() {
	pv.once.Do(func() { close(pv.done) })
}

// forgetLocked removes pv from the table unless another watch has taken
// its key since. p.mu must be held.
func (p *pendingVersions) forgetLocked(pv *pendingVersion) {
	if p.m[pv.key] == pv {
		delete(p.m, pv.key)
		p.bytes -= versionKeyBytes(pv.key)
	}
}

// len is the number of versions asked about.
func (p *pendingVersions) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

// hold is what a watch from k (whose request context is ctx) does before
// it is decided: it returns the pendingVersion to carry when this watch is
// the first to ask, nil when it need not ask (the first watch settled the
// verdict, the table is full, or it waited maxWait in all), and false when
// its own client left while it waited. The watch asks in the place of a
// first it waited on that learnt nothing, or waits for whoever did: for
// maxPendingVersionFirsts firsts at most.
func (p *pendingVersions) hold(ctx context.Context, k versionKey, maxWait time.Duration) (first *pendingVersion, ok bool) {
	first, wait := p.join(ctx, k)
	if wait == nil {
		return first, true
	}
	watchesHeld.Inc()
	t := time.NewTimer(maxWait)
	defer t.Stop()
	for firsts := 1; wait != nil; firsts++ {
		if firsts > maxPendingVersionFirsts {
			return nil, true
		}
		select {
		case <-wait.done:
			if wait.settled.Load() {
				return nil, true
			}
		case <-wait.asker.Done():
		case <-t.C:
			return nil, true
		case <-ctx.Done():
			return nil, false
		}
		// The first learnt nothing, or will not (its client left; the
		// HTTP/2 client that closes a watch and opens the next from the
		// same version sends the next request before the reset of the
		// previous one, so the previous one is often still open when the
		// next joins): ask in its place, or wait for whoever did.
		first, wait = p.join(ctx, k)
	}
	return first, true
}
