package coalesce

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/watchgate/watchgate/proxy/internal/request"
)

// Bounds of Coalescer; see there.
const (
	// maxCoalescedVersions caps the versions asked about at once.
	maxCoalescedVersions = 4096
	// maxCoalescedVersionBytes caps the bytes of their keys (group and
	// resource names as sent, plus a fixed overhead per entry).
	maxCoalescedVersionBytes = 1 << 20
	coalescedVersionOverhead = 128
	// followerWait is the longest a follower waits for its leader's
	// verdict before it goes its own way.
	FollowerWait = 5 * time.Second
	// maxLeadersFollowed is how many leaders a follower waits for: the
	// one it found and one that took its place by hand-over. Followers
	// take a leader's place in the order they came, but a caller may have
	// queued watches ahead of a follower and drop each in turn as it
	// becomes the leader, so without a bound it could hold the follower
	// for all of followerWait.
	maxLeadersFollowed = 2
	// leaderQuietWindow is the shortest time after the leader's 200 without an ERROR event that its version counts as valid.
	// kube-apiserver writes the ERROR event of a too old version right
	// behind the headers from its watch cache, but without the cache (or
	// under load) only after a round trip to etcd: a 410 that comes later
	// than the window lets the followers through, one upstream WATCH each. So
	// the window also grows to twice the slowest such gap seen so far
	// (Coalescer.window), at most maxLeaderQuietWindow.
	// Followers of a valid version wait this long only while their stream is
	// quiet: the first event ends the wait.
	LeaderQuietWindow    = 250 * time.Millisecond
	maxLeaderQuietWindow = time.Second
	// maxFollowers caps the followers waiting in line at once, and
	// maxFollowersPerCaller those of one caller (authenticated identity),
	// so that one caller's followers cannot fill the line for the others:
	// a watch of a caller at its bound, or of any caller while the line is
	// full, waits for the verdict out of line (see Coalescer). A follower
	// in line costs a fixed few hundred bytes besides its request, and
	// each caller with followers one map entry that shares the caller's
	// name with its requests; one out of line costs the Coalescer nothing.
	maxFollowers          = 8192
	maxFollowersPerCaller = 256
)

// versionKey is what a resourceVersion's verdict is about: the version
// parsed as kube-apiserver parses it (decimal, so "007" is 7), never the
// string as sent.
type versionKey struct {
	group, resource string
	version         uint64
}

// KeyOf returns the key of a watch from an explicit
// resourceVersion that the API server answers 410 when it is too old
// (request.Classification.FromVersion), or false for the others: versions that
// are never too old ("" and "0"), versions the proxy cannot parse,
// watch-lists and other watches with sendInitialEvents or
// resourceVersionMatch, which are never answered locally and so are not
// coalesced.
func KeyOf(c *request.Classification) (versionKey, bool) {
	if !c.FromVersion() {
		return versionKey{}, false
	}
	v, err := strconv.ParseUint(c.ResourceVersion, 10, 64)
	if err != nil || v == 0 {
		return versionKey{}, false
	}
	return versionKey{group: c.APIGroup, resource: c.Resource, version: v}, true
}

// Coalescer is request coalescing with hand-over for watches from an
// explicit resourceVersion: concurrent watches from one (group, resource,
// version) ask the API server once. The first one is the leader: it goes
// on and carries the version's leader entry. The followers, watches from
// the same version that come while the leader's verdict is unknown, wait
// (coalesce), then are decided again: by then the engine has learnt the
// version stale (an ERROR 410 went by) and answers them locally, or the
// version proved valid and they all go upstream.
//
// The verdict is valid as soon as the leader saw an event that is not an
// ERROR, or its 200 stayed quiet for leaderQuietWindow, and stale when an
// ERROR 410 went by (settle). When the leader learns nothing (its client
// left, it was rejected, the API server answered another status code, an
// error other than 410, or nothing at all), it hands over (handOver): the
// follower that has waited longest becomes the leader and asks, the others
// follow it, so a client that opens a watch from a stale version and drops
// it at once does not let every follower through, and a watch that comes
// later cannot take the place of one that waits. A watch never follows a
// leader whose client has already left and whom no follower waits for:
// that leader can teach nothing more, so the newcomer takes its place (a
// client that closes each watch and opens the next from the same version,
// as benchmarks and some dashboards do, would otherwise wait for the
// previous watch's handler to unwind). A follower waits for two leaders
// (maxLeadersFollowed) and followerWait at most, then goes its own way.
//
// State is bounded in count (maxCoalescedVersions) and bytes
// (maxCoalescedVersionBytes); when full, watches are not coalesced.
// Waiting followers are kept in line in the order they came, one small
// entry each for as long as its request waits, at most maxFollowers in all
// and maxFollowersPerCaller per caller. Beyond, a follower waits out of
// line: it keeps nothing in the Coalescer and is never handed the
// leader's place; when the leader learns nothing it asks again as a newcomer
// would (and follows the successor if one was handed the place), so that a
// storm larger than its caller's bound still asks the API server once per
// version. A follower holds no place of the replica's watch guard (it is
// decided after its wait). It is safe for concurrent use.
type Coalescer struct {
	mu    sync.Mutex
	m     map[versionKey]*Leader
	bytes int
	// waiting counts the followers waiting per caller, waitingAll in
	// all; p.mu guards them.
	waiting    map[string]int
	waitingAll int
	// slowestStale is the longest gap seen between a watch's 200 and its
	// ERROR 410 event, in nanoseconds.
	slowestStale atomic.Int64
}

// ObserveStale records the gap between a watch's 200 and its ERROR 410.
func (p *Coalescer) ObserveStale(gap time.Duration) {
	for {
		old := p.slowestStale.Load()
		if int64(gap) <= old || p.slowestStale.CompareAndSwap(old, int64(gap)) {
			return
		}
	}
}

// Window is how long a leader's quiet 200 must stay quiet before its
// version counts as valid: twice the slowest 410 gap seen, within
// [floor, maxLeaderQuietWindow].
func (p *Coalescer) Window(floor time.Duration) time.Duration {
	return min(max(floor, 2*time.Duration(p.slowestStale.Load())), max(floor, maxLeaderQuietWindow))
}

// Leader is one version asked about; settle or handOver releases
// its followers.
type Leader struct {
	owner *Coalescer
	key   versionKey
	// asker is the leader's request context: once it is done, the
	// leader will not learn anything more.
	asker    context.Context
	done     chan struct{}
	resolved atomic.Bool
	// settled is set before done closes when the leader learnt the
	// verdict; otherwise its followers ask again.
	settled atomic.Bool
	// followers wait for this version's verdict, in the order they came; the
	// table's lock guards it.
	followers followerLine
	// successor is the leader a follower was handed this one's place as,
	// when it learnt nothing: the one that followers out of line wait for
	// next. Set before done closes.
	successor *Leader
}

// follower is a watch waiting in coalesce; the table's lock guards its fields.
type follower struct {
	ctx context.Context
	// caller is the authenticated caller of its request; placed is set
	// while it counts among the Coalescer's waiting followers.
	caller string
	placed bool
	// on is the leader whose followers it is among; nil when it is
	// not waiting.
	on *Leader
	// lead is set when a leader that learnt nothing handed its place to
	// this follower: the leader it now carries.
	lead *Leader
	// prev and next link it into on's followerLine.
	prev, next *follower
}

// followerLine is the followers waiting for one leader, in the order they
// came: a list linked through the followers themselves, so that one follower
// leaving costs the same however many wait (a caller that opens thousands
// of followers and drops them one by one must not hold the table's lock, which
// every watch from an explicit version takes, for longer each time).
type followerLine struct {
	head, tail *follower
	n          int
}

// push puts fw at the end of the line.
func (l *followerLine) push(fw *follower) {
	fw.prev, fw.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = fw
	} else {
		l.head = fw
	}
	l.tail = fw
	l.n++
}

// remove takes fw, which must be in the line, out of it.
func (l *followerLine) remove(fw *follower) {
	if fw.prev != nil {
		fw.prev.next = fw.next
	} else {
		l.head = fw.next
	}
	if fw.next != nil {
		fw.next.prev = fw.prev
	} else {
		l.tail = fw.prev
	}
	fw.prev, fw.next = nil, nil
	l.n--
}

// New returns a Coalescer with no watch waiting.
func New() *Coalescer {
	return &Coalescer{m: map[versionKey]*Leader{}, waiting: map[string]int{}}
}

// placeLocked counts fw among the waiting followers, if its caller and the
// Coalescer are below their bounds; it reports whether fw may wait. p.mu
// must be held.
func (p *Coalescer) placeLocked(fw *follower) bool {
	if fw.placed {
		return true
	}
	if p.waitingAll >= maxFollowers || p.waiting[fw.caller] >= maxFollowersPerCaller {
		return false
	}
	fw.placed = true
	p.waiting[fw.caller]++
	p.waitingAll++
	return true
}

// unplace stops counting fw among the waiting followers.
func (p *Coalescer) unplace(fw *follower) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !fw.placed {
		return
	}
	fw.placed = false
	p.waitingAll--
	if n := p.waiting[fw.caller] - 1; n > 0 {
		p.waiting[fw.caller] = n
	} else {
		delete(p.waiting, fw.caller)
	}
}

func versionKeyBytes(k versionKey) int {
	return len(k.group) + len(k.resource) + coalescedVersionOverhead
}

// join returns the leader to carry when fw (the watch whose
// request context is fw.ctx) is the leader from k, or the one it now
// waits for when another watch is asking: among its followers in line
// (fw.on is set) when fw's caller and the line are below their bounds, out
// of line otherwise; both nil when the table is full.
func (p *Coalescer) join(fw *follower, k versionKey) (lead, wait *Leader) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.joinLocked(fw, k)
}

// joinLocked is join; p.mu must be held.
func (p *Coalescer) joinLocked(fw *follower, k versionKey) (lead, wait *Leader) {
	if pv, ok := p.m[k]; ok && pv.asker.Err() != nil && !pv.resolved.Swap(true) {
		// Its client left: its place goes to the follower that has waited
		// longest, if any, and this watch waits for that one.
		p.resolveLocked(pv, false)
	}
	if pv, ok := p.m[k]; ok {
		// Its client is there, or it is being resolved (which then
		// releases fw with the others).
		if !p.placeLocked(fw) {
			return nil, pv // out of line
		}
		fw.on = pv
		pv.followers.push(fw)
		return nil, pv
	}
	n := versionKeyBytes(k)
	if len(p.m) >= maxCoalescedVersions || p.bytes+n > maxCoalescedVersionBytes {
		return nil, nil
	}
	return p.addLocked(fw.ctx, k), nil
}

// addLocked puts a leader asked by the watch whose request context
// is asker into the table, which must have room for it. p.mu must be held.
func (p *Coalescer) addLocked(asker context.Context, k versionKey) *Leader {
	pv := &Leader{owner: p, key: k, asker: asker, done: make(chan struct{})}
	p.m[k] = pv
	p.bytes += versionKeyBytes(k)
	return pv
}

// Settle ends the wait of pv's followers with a verdict: the version is
// valid, or the engine has learnt it stale. Only the first settle or
// HandOver does anything (the leader settles on every event of its
// stream, so later calls must not take the table's lock).
func (pv *Leader) Settle() { pv.resolve(true) }

// HandOver ends pv's wait without a verdict: the follower that has waited
// longest asks in its place, the others wait for it. After settle, it
// does nothing.
func (pv *Leader) HandOver() { pv.resolve(false) }

func (pv *Leader) resolve(settled bool) {
	if pv.resolved.Swap(true) {
		return
	}
	p := pv.owner
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resolveLocked(pv, settled)
}

// resolveLocked takes pv out of the table and releases its followers. With a
// verdict, all of them; without one, the longest-waiting follower whose client
// is still there becomes the leader of a successor, and the others whose
// clients are there wait for it. The caller has set pv.resolved; p.mu must
// be held.
func (p *Coalescer) resolveLocked(pv *Leader, settled bool) {
	if p.m[pv.key] == pv {
		delete(p.m, pv.key)
		p.bytes -= versionKeyBytes(pv.key)
	}
	if settled {
		pv.settled.Store(true)
	}
	var next *Leader
	for fw := pv.followers.head; fw != nil; {
		after := fw.next
		fw.on, fw.prev, fw.next = nil, nil, nil
		switch {
		case settled || fw.ctx.Err() != nil:
		case next == nil && p.m[pv.key] == nil:
			next = p.addLocked(fw.ctx, pv.key)
			fw.lead = next
		case next != nil:
			fw.on = next
			next.followers.push(fw)
		}
		fw = after
	}
	pv.followers = followerLine{}
	pv.successor = next
	close(pv.done)
}

// leaveLocked takes fw out of the followers it waits among. p.mu must be held.
func (p *Coalescer) leaveLocked(fw *follower) {
	if pv := fw.on; pv != nil {
		pv.followers.remove(fw)
		fw.on = nil
	}
}

// len is the number of versions asked about.
func (p *Coalescer) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

// Coalesce is what a watch from k (whose request context is ctx, whose
// caller is caller) does before it is decided: it returns the leader to
// carry when this watch is the leader, nil when it need not ask (the
// leader settled the verdict, the table is full, or it waited maxWait in
// all), and false when its own client left while it waited. A follower in
// line asks in the place of a leader that learnt nothing when it has waited
// longest, or waits for whoever does; one out of line joins again: for
// maxLeadersFollowed leaders at most.
func (p *Coalescer) Coalesce(ctx context.Context, k versionKey, caller string, maxWait time.Duration) (lead *Leader, ok bool) {
	fw := &follower{ctx: ctx, caller: caller}
	lead, wait := p.join(fw, k)
	if wait == nil {
		return lead, true
	}
	defer p.unplace(fw)
	WatchesCoalesced.Inc()
	t := time.NewTimer(maxWait)
	defer t.Stop()
	leaders := 1
	for {
		clientLeft, timedOut := false, false
		select {
		case <-wait.done:
		case <-wait.asker.Done():
			// The leader will not learn anything more: hand over now
			// rather than when its handler unwinds (the HTTP/2 client
			// that closes a watch and opens the next from the same
			// version sends the next request before the reset of the
			// previous one, so the previous one is often still open when
			// the next joins). If another goroutine is resolving it, that
			// only waits for the table's lock.
			wait.HandOver()
			<-wait.done
		case <-t.C:
			timedOut = true
		case <-ctx.Done():
			clientLeft = true
		}
		p.mu.Lock()
		if fw.lead != nil {
			// Handed the leader's place, possibly as the client left or
			// the wait ran out: it asks, or hands over again.
			lead := fw.lead
			p.mu.Unlock()
			if clientLeft {
				lead.HandOver()
				return nil, false
			}
			return lead, true
		}
		if clientLeft || timedOut {
			p.leaveLocked(fw)
			p.mu.Unlock()
			return nil, !clientLeft
		}
		switch {
		case wait.settled.Load():
			p.mu.Unlock()
			return nil, true
		case fw.on != nil:
			// The leader handed over to a follower ahead of this one.
			leaders++
			if leaders > maxLeadersFollowed {
				p.leaveLocked(fw)
				p.mu.Unlock()
				return nil, true
			}
			wait = fw.on
		case ctx.Err() != nil:
			// Released without a successor while its client left.
			p.mu.Unlock()
			return nil, false
		case wait.successor != nil:
			// Out of line: the leader handed over to a follower in line.
			leaders++
			if leaders > maxLeadersFollowed {
				p.mu.Unlock()
				return nil, true
			}
			wait = wait.successor
		default:
			// Released without a successor: ask again.
			leaders++
			if leaders > maxLeadersFollowed {
				p.mu.Unlock()
				return nil, true
			}
			f, w := p.joinLocked(fw, k)
			if w == nil {
				p.mu.Unlock()
				return f, true
			}
			wait = w
		}
		p.mu.Unlock()
	}
}

// WatchesCoalesced counts the followers: watch opens held back while their
// leader asked the API server whether their resourceVersion is too old.
var WatchesCoalesced = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "watchgate_proxy_watches_coalesced_total",
	Help: "Followers: watch opens held back while their leader, another watch from the same resourceVersion, asked the API server whether it is too old.",
})

func init() { metrics.Registry.MustRegister(WatchesCoalesced) }
