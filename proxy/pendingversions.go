package proxy

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
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
	// one it found and one that took its place. Twins take a first's
	// place in the order they came, but a caller may have queued watches
	// ahead of a twin and drop each in turn as it becomes the first, so
	// without a bound it could hold the twin for all of
	// pendingVersionWait.
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
// resourceVersion that the API server answers 410 when it is too old
// (classification.fromVersion), or false for the others: versions that
// are never too old ("" and "0"), versions the proxy cannot parse,
// watch-lists and other watches with sendInitialEvents or
// resourceVersionMatch, which are never answered locally and so are not
// held.
func pendingVersionKey(c *classification) (versionKey, bool) {
	if !c.fromVersion() {
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
// another status code, an error other than 410, or nothing at all), it
// hands over (abandon): the twin that has waited longest asks in its
// place and the others wait for that one, so a client that opens a watch
// from a stale version and drops it at once does not let every twin
// through, and a watch that comes later cannot take the place of one that
// waits. A watch never waits for a first whose client has already left
// and whom no twin waits for: that watch can teach nothing more, so the
// newcomer takes its place (a client that closes each watch and opens the
// next from the same version, as benchmarks and some dashboards do, would
// otherwise wait for the previous watch's handler to unwind). A twin waits
// for two firsts (maxPendingVersionFirsts) and pendingVersionWait at most,
// then goes its own way.
//
// State is bounded in count (maxPendingVersions) and bytes
// (maxPendingVersionBytes); when full, watches are not held. Waiting twins
// are kept in the order they came, one small entry each for as long as
// its request waits. It is safe for concurrent use.
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
	resolved atomic.Bool
	// settled is set before done closes when the first watch learnt the
	// verdict; otherwise its twins ask again.
	settled atomic.Bool
	// twins wait for this version's verdict, in the order they came; the
	// table's lock guards it.
	twins twinLine
}

// twin is a watch waiting in hold; the table's lock guards its fields.
type twin struct {
	ctx context.Context
	// on is the pendingVersion whose twins it is among; nil when it is
	// not waiting.
	on *pendingVersion
	// first is set when a first that learnt nothing handed its place to
	// this twin: the pendingVersion it now carries.
	first *pendingVersion
	// prev and next link it into on's twinLine.
	prev, next *twin
}

// twinLine is the twins waiting for one pendingVersion, in the order they
// came: a list linked through the twins themselves, so that one twin
// leaving costs the same however many wait (a caller that opens thousands
// of twins and drops them one by one must not hold the table's lock, which
// every watch from an explicit version takes, for longer each time).
type twinLine struct {
	head, tail *twin
	n          int
}

// push puts tw at the end of the line.
func (l *twinLine) push(tw *twin) {
	tw.prev, tw.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = tw
	} else {
		l.head = tw
	}
	l.tail = tw
	l.n++
}

// remove takes tw, which must be in the line, out of it.
func (l *twinLine) remove(tw *twin) {
	if tw.prev != nil {
		tw.prev.next = tw.next
	} else {
		l.head = tw.next
	}
	if tw.next != nil {
		tw.next.prev = tw.prev
	} else {
		l.tail = tw.prev
	}
	tw.prev, tw.next = nil, nil
	l.n--
}

func newPendingVersions() *pendingVersions {
	return &pendingVersions{m: map[versionKey]*pendingVersion{}}
}

func versionKeyBytes(k versionKey) int {
	return len(k.group) + len(k.resource) + pendingVersionOverhead
}

// join returns the pendingVersion to carry when tw (the watch whose
// request context is tw.ctx) is the first from key, or the one it now
// waits for, among its twins, when another watch is asking; both nil when
// the table is full.
func (p *pendingVersions) join(tw *twin, k versionKey) (first, wait *pendingVersion) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.joinLocked(tw, k)
}

// joinLocked is join; p.mu must be held.
func (p *pendingVersions) joinLocked(tw *twin, k versionKey) (first, wait *pendingVersion) {
	if pv, ok := p.m[k]; ok && pv.asker.Err() != nil && !pv.resolved.Swap(true) {
		// Its client left: its place goes to the twin that has waited
		// longest, if any, and this watch waits for that one.
		p.resolveLocked(pv, false)
	}
	if pv, ok := p.m[k]; ok {
		// Its client is there, or it is being resolved (which then
		// releases tw with the others).
		tw.on = pv
		pv.twins.push(tw)
		return nil, pv
	}
	n := versionKeyBytes(k)
	if len(p.m) >= maxPendingVersions || p.bytes+n > maxPendingVersionBytes {
		return nil, nil
	}
	return p.addLocked(tw.ctx, k), nil
}

// addLocked puts a pendingVersion asked by the watch whose request context
// is asker into the table, which must have room for it. p.mu must be held.
func (p *pendingVersions) addLocked(asker context.Context, k versionKey) *pendingVersion {
	pv := &pendingVersion{owner: p, key: k, asker: asker, done: make(chan struct{})}
	p.m[k] = pv
	p.bytes += versionKeyBytes(k)
	return pv
}

// settle ends the wait of pv's twins with a verdict: the version is
// valid, or the engine has learnt it stale. Only the first settle or
// abandon does anything (the first watch settles on every event of its
// stream, so later calls must not take the table's lock).
func (pv *pendingVersion) settle() { pv.resolve(true) }

// abandon ends pv's wait without a verdict: the twin that has waited
// longest asks in its place, the others wait for it. After settle, it
// does nothing.
func (pv *pendingVersion) abandon() { pv.resolve(false) }

func (pv *pendingVersion) resolve(settled bool) {
	if pv.resolved.Swap(true) {
		return
	}
	p := pv.owner
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resolveLocked(pv, settled)
}

// resolveLocked takes pv out of the table and releases its twins. With a
// verdict, all of them; without one, the longest-waiting twin whose client
// is still there becomes the first of a successor, and the others whose
// clients are there wait for it. The caller has set pv.resolved; p.mu must
// be held.
func (p *pendingVersions) resolveLocked(pv *pendingVersion, settled bool) {
	if p.m[pv.key] == pv {
		delete(p.m, pv.key)
		p.bytes -= versionKeyBytes(pv.key)
	}
	if settled {
		pv.settled.Store(true)
	}
	var next *pendingVersion
	for tw := pv.twins.head; tw != nil; {
		after := tw.next
		tw.on, tw.prev, tw.next = nil, nil, nil
		switch {
		case settled || tw.ctx.Err() != nil:
		case next == nil && p.m[pv.key] == nil:
			next = p.addLocked(tw.ctx, pv.key)
			tw.first = next
		case next != nil:
			tw.on = next
			next.twins.push(tw)
		}
		tw = after
	}
	pv.twins = twinLine{}
	close(pv.done)
}

// leaveLocked takes tw out of the twins it waits among. p.mu must be held.
func (p *pendingVersions) leaveLocked(tw *twin) {
	if pv := tw.on; pv != nil {
		pv.twins.remove(tw)
		tw.on = nil
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
// its own client left while it waited. A twin asks in the place of a first
// that learnt nothing when it has waited longest, or waits for whoever
// does: for maxPendingVersionFirsts firsts at most.
func (p *pendingVersions) hold(ctx context.Context, k versionKey, maxWait time.Duration) (first *pendingVersion, ok bool) {
	tw := &twin{ctx: ctx}
	first, wait := p.join(tw, k)
	if wait == nil {
		return first, true
	}
	watchesHeld.Inc()
	t := time.NewTimer(maxWait)
	defer t.Stop()
	firsts := 1
	for {
		clientLeft, timedOut := false, false
		select {
		case <-wait.done:
		case <-wait.asker.Done():
			// The first will not learn anything more: hand over now
			// rather than when its handler unwinds (the HTTP/2 client
			// that closes a watch and opens the next from the same
			// version sends the next request before the reset of the
			// previous one, so the previous one is often still open when
			// the next joins). If another goroutine is resolving it, that
			// only waits for the table's lock.
			wait.abandon()
			<-wait.done
		case <-t.C:
			timedOut = true
		case <-ctx.Done():
			clientLeft = true
		}
		p.mu.Lock()
		if tw.first != nil {
			// Handed the first's place, possibly as the client left or
			// the wait ran out: it asks, or hands over again.
			first := tw.first
			p.mu.Unlock()
			if clientLeft {
				first.abandon()
				return nil, false
			}
			return first, true
		}
		if clientLeft || timedOut {
			p.leaveLocked(tw)
			p.mu.Unlock()
			return nil, !clientLeft
		}
		switch {
		case wait.settled.Load():
			p.mu.Unlock()
			return nil, true
		case tw.on != nil:
			// The first handed over to a twin ahead of this one.
			firsts++
			if firsts > maxPendingVersionFirsts {
				p.leaveLocked(tw)
				p.mu.Unlock()
				return nil, true
			}
		case ctx.Err() != nil:
			// Released without a successor while its client left.
			p.mu.Unlock()
			return nil, false
		default:
			// Released without a successor: ask again.
			firsts++
			if firsts > maxPendingVersionFirsts {
				p.mu.Unlock()
				return nil, true
			}
			f, w := p.joinLocked(tw, k)
			if w == nil {
				p.mu.Unlock()
				return f, true
			}
		}
		wait = tw.on
		p.mu.Unlock()
	}
}
