package coalesce

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/ratelimit"
)

// The table of pending versions is bounded in count and bytes, and keyed
// by the parsed version: "007" and "7" are one version.
func TestCoalescerIsBoundedAndParsed(t *testing.T) {
	p := New()
	k1, ok1 := KeyOf(&request.Classification{Verb: ratelimit.VerbWatch, ResourceVersion: "007", Resource: "pods"})
	k2, ok2 := KeyOf(&request.Classification{Verb: ratelimit.VerbWatch, ResourceVersion: "7", Resource: "pods"})
	if !ok1 || !ok2 || k1 != k2 {
		t.Fatalf("keys %v %v, want one key for 007 and 7", k1, k2)
	}
	for _, rv := range []string{"", "0", "x", "-1", "99999999999999999999999"} {
		if _, ok := KeyOf(&request.Classification{Verb: ratelimit.VerbWatch, ResourceVersion: rv, Resource: "pods"}); ok {
			t.Errorf("version %q is held, want it passed", rv)
		}
	}
	ctx := context.Background()
	lead, wait := p.join(&follower{ctx: ctx}, k1)
	if lead == nil || wait != nil {
		t.Fatal("the leader must not wait")
	}
	if f, w := p.join(&follower{ctx: ctx}, k2); f != nil || w == nil {
		t.Fatal("a follower must wait")
	}
	lead.Settle()
	lead.HandOver()
	if p.len() != 0 || p.bytes != 0 {
		t.Fatalf("%d entries, %d bytes left after settle", p.len(), p.bytes)
	}
	long := strings.Repeat("r", 64<<10)
	n := 0
	for i := range maxCoalescedVersions + 10 {
		if f, _ := p.join(&follower{ctx: ctx}, versionKey{resource: long, version: uint64(i + 1)}); f != nil {
			n++
		}
	}
	if p.bytes > maxCoalescedVersionBytes || n >= maxCoalescedVersions {
		t.Errorf("%d entries of %d bytes held, want at most %d bytes", n, p.bytes, maxCoalescedVersionBytes)
	}
}

// A watch whose leader's client has left, and whom no follower waits
// for, does not wait: it takes the leader's place. The leader's own late
// abandon does not remove its successor.
func TestAWatchDoesNotFollowALeaderWhoseClientLeft(t *testing.T) {
	p, k, lead, leave := leaderThatLeaves(t)
	leave()
	next, wait := p.join(&follower{ctx: context.Background()}, k)
	if next == nil || wait != nil {
		t.Fatalf("after the leader's client left: lead=%v wait=%v, want a new leader that does not wait", next, wait)
	}
	lead.HandOver() // the old leader's handler unwinds late
	twinCtx, twinLeaves := context.WithCancel(context.Background())
	if _, w := p.join(&follower{ctx: twinCtx}, k); w != next {
		t.Error("the old leader's abandon removed its successor")
	}
	twinLeaves() // so that next's abandon hands its place to nobody
	next.HandOver()
	if p.len() != 0 || p.bytes != 0 {
		t.Errorf("%d entries, %d bytes left", p.len(), p.bytes)
	}
}

// The place of a leader that learns nothing goes to the follower that has
// waited longest, never to a watch that comes later: a caller that drops
// its first watch and opens the next at once does not get in front of
// the followers that waited. The others wait for the new leader, and a follower
// stops waiting after two leaders.
func TestTheLongestWaitingFollowerLeadsNext(t *testing.T) {
	p, k, lead, leave := leaderThatLeaves(t)
	defer lead.HandOver()
	followers := make([]<-chan held, 3)
	for i := range followers {
		followers[i] = coalesceJoined(t, p, k)
	}
	// The leader's client leaves and a newcomer from the same caller asks
	// at once, as an HTTP/2 client that closes a watch and opens the next
	// does: the newcomer finds the leader gone under the table's lock,
	// before any follower is scheduled.
	p.mu.Lock()
	leave()
	newcomer := &follower{ctx: context.Background()}
	if f, w := p.joinLocked(newcomer, k); f != nil || w == nil {
		p.mu.Unlock()
		t.Fatalf("the newcomer got lead=%v wait=%v, want it to wait behind the followers", f, w)
	}
	p.mu.Unlock()
	oldest := wantAsks(t, followers[0], "the longest-waiting follower")
	wantWaits(t, followers[1], "the second follower")
	wantWaits(t, followers[2], "the third follower")
	oldest.HandOver() // it learnt nothing either
	second := wantAsks(t, followers[1], "the second follower")
	// The third has now waited for two leaders: the one it found and the
	// oldest follower; it does not wait for a third.
	wantGoesOnWithoutAsking(t, followers[2], "after two leaders, the third follower")
	second.Settle()
	p.mu.Lock()
	defer p.mu.Unlock()
	if newcomer.on != nil || newcomer.lead != nil {
		t.Errorf("the newcomer is still among followers (%v) or asks (%v) after a verdict", newcomer.on, newcomer.lead)
	}
	if len(p.m) != 0 || p.bytes != 0 {
		t.Errorf("%d entries, %d bytes left", len(p.m), p.bytes)
	}
}

// A follower whose client leaves, or whose wait runs out, leaves the line: it
// is not handed the leader's place, and it is not kept. Nor is one whose
// client has left but that has not yet stepped out of the line.
func TestAFollowerThatLeavesIsNotHandedThePlace(t *testing.T) {
	p := New()
	k := versionKey{resource: "pods", version: 7}
	lead, _ := p.join(&follower{ctx: context.Background()}, k)
	ctx, leave := context.WithCancel(context.Background())
	left := coalesceJoinedWith(t, p, k, ctx, time.Hour)
	timedOut := coalesceJoinedWith(t, p, k, context.Background(), 50*time.Millisecond)
	goneCtx, gone := context.WithCancel(context.Background())
	notYetOut := &follower{ctx: goneCtx}
	if _, w := p.join(notYetOut, k); w == nil {
		t.Fatal("want the follower to wait")
	}
	stays := coalesceJoined(t, p, k)
	gone()
	leave()
	if h := <-left; h.ok || h.lead != nil {
		t.Errorf("the follower whose client left got lead=%v ok=%v, want ok=false", h.lead, h.ok)
	}
	if h := <-timedOut; !h.ok || h.lead != nil {
		t.Errorf("the follower whose wait ran out got lead=%v ok=%v, want to go on without asking", h.lead, h.ok)
	}
	lead.HandOver()
	next := wantAsks(t, stays, "the follower that stayed")
	p.mu.Lock()
	if n := p.m[k].followers.n; n != 0 {
		t.Errorf("%d followers kept, want none", n)
	}
	if notYetOut.lead != nil || notYetOut.on != nil {
		t.Errorf("the follower whose client left was handed the place (%v) or kept waiting (%v)", notYetOut.lead, notYetOut.on)
	}
	p.mu.Unlock()
	next.Settle()
}

// A follower that is already waiting asks in the leader's place as soon as the
// leader's client leaves, before the leader's handler has
// unwound; a second follower then waits for it, and goes on with its verdict.
func TestAFollowerLeadsWhenTheLeadersClientLeaves(t *testing.T) {
	p, k, lead, leave := leaderThatLeaves(t)
	defer lead.HandOver()
	hold := func() <-chan held { return coalesceInBackground(p, k) }
	waiting := hold()
	select {
	case <-waiting:
		t.Fatal("the follower went on while the leader's client was there")
	case <-time.After(20 * time.Millisecond):
	}
	leave()
	var next held
	select {
	case next = <-waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("the follower still waits after the leader's client left")
	}
	if !next.ok || next.lead == nil {
		t.Fatalf("the follower got lead=%v ok=%v, want it to ask in the leader's place", next.lead, next.ok)
	}
	second := hold()
	select {
	case <-second:
		t.Fatal("a second follower went on while the new leader was asking")
	case <-time.After(20 * time.Millisecond):
	}
	next.lead.Settle()
	wantGoesOnWithoutAsking(t, second, "after a verdict, the second follower")
}

// leaderThatLeaves returns a table holding a leader from pods at
// version 7, whose client leaves when leave is called.
func leaderThatLeaves(t *testing.T) (p *Coalescer, k versionKey, lead *Leader, leave context.CancelFunc) {
	t.Helper()
	p = New()
	k = versionKey{resource: "pods", version: 7}
	gone, leave := context.WithCancel(context.Background())
	t.Cleanup(leave)
	if lead, _ = p.join(&follower{ctx: gone}, k); lead == nil {
		t.Fatal("want a leader")
	}
	return p, k, lead, leave
}

// A line of followers keeps the order they came in, whichever of them leave.
func TestFollowerLineKeepsTheOrder(t *testing.T) {
	for name, tc := range map[string]struct {
		leave []int
		want  []int
	}{
		"nobody leaves":        {nil, []int{0, 1, 2, 3}},
		"the head leaves":      {[]int{0}, []int{1, 2, 3}},
		"one in the middle":    {[]int{2}, []int{0, 1, 3}},
		"the tail leaves":      {[]int{3}, []int{0, 1, 2}},
		"all leave, head last": {[]int{3, 1, 2, 0}, nil},
		"the tail twice":       {[]int{3, 2}, []int{0, 1}},
	} {
		t.Run(name, func(t *testing.T) {
			var l followerLine
			tws := make([]*follower, 4)
			for i := range tws {
				tws[i] = &follower{}
				l.push(tws[i])
			}
			for _, i := range tc.leave {
				l.remove(tws[i])
			}
			var got []int
			for fw := l.head; fw != nil; fw = fw.next {
				got = append(got, slices.Index(tws, fw))
			}
			var back []int
			for fw := l.tail; fw != nil; fw = fw.prev {
				back = append([]int{slices.Index(tws, fw)}, back...)
			}
			if !slices.Equal(got, tc.want) || !slices.Equal(back, tc.want) || l.n != len(tc.want) {
				t.Errorf("line %v (from the tail %v, n=%d), want %v", got, back, l.n, tc.want)
			}
		})
	}
}

type held struct {
	lead *Leader
	ok   bool
}

// coalesceInBackground holds a watch from k with no client deadline and
// sends what coalesce returned.
func coalesceInBackground(p *Coalescer, k versionKey) <-chan held {
	c := make(chan held, 1)
	go func() {
		f, ok := p.Coalesce(context.Background(), k, "alice", time.Hour)
		c <- held{f, ok}
	}()
	return c
}

// coalesceJoined holds a watch from k in the background and returns once it
// waits among the followers.
func coalesceJoined(t *testing.T, p *Coalescer, k versionKey) <-chan held {
	t.Helper()
	return coalesceJoinedWith(t, p, k, context.Background(), time.Hour)
}

// coalesceJoinedWith is coalesceJoined for a client context and a longest wait.
func coalesceJoinedWith(t *testing.T, p *Coalescer, k versionKey, ctx context.Context, maxWait time.Duration) <-chan held {
	t.Helper()
	waiting := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		if pv := p.m[k]; pv != nil {
			return pv.followers.n
		}
		return 0
	}
	before := waiting()
	c := make(chan held, 1)
	go func() {
		f, ok := p.Coalesce(ctx, k, "alice", maxWait)
		c <- held{f, ok}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for waiting() == before {
		if time.Now().After(deadline) {
			t.Fatal("the watch did not join the followers")
		}
		time.Sleep(time.Millisecond)
	}
	return c
}

// wantAsks fails unless the held watch went on, within 5s, as the leader
// to ask, and returns what it carries.
func wantAsks(t *testing.T, c <-chan held, who string) *Leader {
	t.Helper()
	select {
	case h := <-c:
		if !h.ok || h.lead == nil {
			t.Fatalf("%s got lead=%v ok=%v, want it to ask", who, h.lead, h.ok)
		}
		return h.lead
	case <-time.After(5 * time.Second):
		t.Fatalf("%s still waits", who)
	}
	return nil
}

// wantWaits fails if the held watch goes on within 20ms.
func wantWaits(t *testing.T, c <-chan held, who string) {
	t.Helper()
	select {
	case h := <-c:
		t.Fatalf("%s went on (lead=%v ok=%v), want it to wait", who, h.lead, h.ok)
	case <-time.After(20 * time.Millisecond):
	}
}

// wantGoesOnWithoutAsking fails unless the held watch went on, within 5s,
// without being the leader.
func wantGoesOnWithoutAsking(t *testing.T, c <-chan held, who string) {
	t.Helper()
	select {
	case h := <-c:
		if !h.ok || h.lead != nil {
			t.Errorf("%s got lead=%v ok=%v, want it to go on without asking", who, h.lead, h.ok)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s still waits", who)
	}
}

// A follower's wait is bounded in all, however many leaders learn nothing, and
// ends when its own client leaves.
func TestAFollowersWaitIsBounded(t *testing.T) {
	p := New()
	k := versionKey{resource: "pods", version: 7}
	lead, _ := p.join(&follower{ctx: context.Background()}, k)
	defer lead.HandOver()
	start := time.Now()
	if f, ok := p.Coalesce(context.Background(), k, "alice", 30*time.Millisecond); f != nil || !ok {
		t.Errorf("after the longest wait: lead=%v ok=%v, want to go on without asking", f, ok)
	}
	if waited := time.Since(start); waited < 30*time.Millisecond {
		t.Errorf("waited %v, want the whole 30ms", waited)
	}
	ctx, leave := context.WithCancel(context.Background())
	leave()
	if _, ok := p.Coalesce(ctx, k, "alice", time.Hour); ok {
		t.Error("hold says go on for a client that left")
	}
}

func TestQuietWindowGrowsWithTheSlowest410(t *testing.T) {
	p := New()
	floor := LeaderQuietWindow
	steps := []struct {
		observe time.Duration // 0: observe nothing
		want    time.Duration
	}{
		{0, floor},                     // nothing seen: the floor
		{50 * time.Millisecond, floor}, // 2×50ms is under the floor
		{200 * time.Millisecond, 400 * time.Millisecond}, // twice the slowest gap
		{100 * time.Millisecond, 400 * time.Millisecond}, // a faster 410 does not shrink it
		{3 * time.Second, maxLeaderQuietWindow},          // capped
	}
	for i, s := range steps {
		if s.observe > 0 {
			p.ObserveStale(s.observe)
		}
		if got := p.Window(floor); got != s.want {
			t.Errorf("step %d (observed %v): window %v, want %v", i, s.observe, got, s.want)
		}
	}
}

// A follower waits for at most two leaders: the one it found and one that took
// its place. A caller that queued watches from the version ahead of the
// follower and drops each as it becomes the leader holds the follower for two of
// them, not for followerWait.
func TestAFollowerWaitsForAtMostTwoLeaders(t *testing.T) {
	p := New()
	k := versionKey{resource: "pods", version: 7}
	lead, _ := p.join(&follower{ctx: context.Background()}, k)
	defer lead.HandOver()
	callers := []<-chan held{coalesceJoined(t, p, k), coalesceJoined(t, p, k)}
	waiting := coalesceJoined(t, p, k)
	lead.HandOver()
	second := wantAsks(t, callers[0], "the caller's first queued watch")
	wantWaits(t, waiting, "the follower, while its second leader asks,")
	second.HandOver()
	third := wantAsks(t, callers[1], "the caller's second queued watch")
	defer third.HandOver()
	wantGoesOnWithoutAsking(t, waiting, "after two leaders left, the follower")
}

// One caller's followers cannot fill the coalescer: beyond
// maxFollowersPerCaller its next watch waits without a place in the line
// (it is never handed the leader's place), while another caller's still
// takes one; a follower that stops waiting frees its place.
func TestFollowersAreBoundedPerCaller(t *testing.T) {
	p := New()
	k := versionKey{resource: "pods", version: 5}
	ctx := context.Background()
	lead, _ := p.join(&follower{ctx: ctx, caller: "alice"}, k)
	if lead == nil {
		t.Fatal("want a leader")
	}
	defer lead.Settle()
	for i := range maxFollowersPerCaller {
		if _, w := p.join(&follower{ctx: ctx, caller: "alice"}, k); w == nil {
			t.Fatalf("alice's follower %d does not wait", i)
		}
	}
	beyond := &follower{ctx: ctx, caller: "alice"}
	if f, w := p.join(beyond, k); f != nil || w != lead || beyond.placed || beyond.on != nil {
		t.Errorf("alice's follower beyond her bound: lead=%v wait=%v placed=%v in line=%v, want it to wait out of line",
			f, w, beyond.placed, beyond.on != nil)
	}
	bob := &follower{ctx: ctx, caller: "bob"}
	if _, w := p.join(bob, k); w == nil || !bob.placed {
		t.Fatal("bob's follower does not take a place")
	}
	p.mu.Lock()
	p.leaveLocked(bob)
	p.mu.Unlock()
	p.unplace(bob)
	if n, all := p.waiting["bob"], p.waitingAll; n != 0 || all != maxFollowersPerCaller {
		t.Errorf("after bob left: bob %d, all %d; want 0 and %d", n, all, maxFollowersPerCaller)
	}
}

// A storm of one caller's watches from one version, more than its
// followers' bound, asks the API server once: the watches beyond the
// bound wait for the verdict too, and when the leader learns nothing
// exactly one watch asks in its place.
func TestAStormBeyondTheCallersBoundAsksOnce(t *testing.T) {
	p := New()
	k := versionKey{resource: "configmaps", version: 225}
	lead, _ := p.join(&follower{ctx: context.Background(), caller: "alice"}, k)
	if lead == nil {
		t.Fatal("want a leader")
	}
	const storm = maxFollowersPerCaller + 100
	coalescedBefore := coalescedSoFar(t)
	results := make(chan held, storm)
	for range storm {
		go func() {
			f, ok := p.Coalesce(context.Background(), k, "alice", time.Hour)
			results <- held{f, ok}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for int(coalescedSoFar(t)-coalescedBefore)+len(results) < storm {
		if time.Now().After(deadline) {
			t.Fatal("the storm's watches neither waited nor went on")
		}
		time.Sleep(time.Millisecond)
	}
	if n := len(results); n != 0 {
		t.Fatalf("%d of %d watches went on while the leader's verdict was pending, want all to wait", n, storm)
	}
	lead.HandOver()
	next := wantAsks(t, results, "the watch handed the leader's place")
	next.Settle()
	for i := range storm - 1 {
		select {
		case h := <-results:
			if !h.ok || h.lead != nil {
				t.Fatalf("watch %d after the verdict: lead=%p ok=%v, want it to go on without asking", i, h.lead, h.ok)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d watches still wait after the verdict", storm-1-i)
		}
	}
	if n, all := p.waiting["alice"], p.waitingAll; n != 0 || all != 0 {
		t.Errorf("after the storm: alice %d, all %d waiting; want 0", n, all)
	}
}

// Only a watch from an explicit version without sendInitialEvents and
// resourceVersionMatch (request.Classification.FromVersion) is held for another
// from the same version.
func TestCoalescingHoldsOnlyWatchesFromVersion(t *testing.T) {
	for query, want := range map[string]bool{
		"watch=true&resourceVersion=42":                                   true,
		"watch=true&resourceVersion=42&allowWatchBookmarks=true":          true,
		"watch=true&resourceVersion=42&resourceVersionMatch=NotOlderThan": false,
		"watch=true&resourceVersion=42&sendInitialEvents=true":            false,
		"watch=true&resourceVersion=0":                                    false,
		"watch=true":                                                      false,
		"resourceVersion=42":                                              false, // a list
	} {
		var c *request.Classification
		h := request.WithClassification(request.NewRequestInfoFactory(), logtest.Discard(), http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			c, _ = request.ClassificationFrom(r.Context())
		}))
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/ns/configmaps?"+query, nil))
		if c == nil {
			t.Fatalf("%s: not classified", query)
		}
		if _, held := KeyOf(c); held != want || c.FromVersion() != want {
			t.Errorf("%s: held for its twins %v, from version %v, want %v", query, held, c.FromVersion(), want)
		}
	}
}

// coalescedSoFar is WatchesCoalesced's count.
func coalescedSoFar(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	if err := WatchesCoalesced.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
