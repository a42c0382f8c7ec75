package proxy

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watchgate/watchgate/ratelimit"
)

// Concurrent watches from one version ask the API server once: when the
// first one's stream says 410, the others get the local answer; when it
// says the version is valid (an event, or a quiet 200), they all go
// upstream.
func TestTwinWatchesWaitForTheFirstVerdict(t *testing.T) {
	for name, tc := range map[string]struct {
		firstEvent    []byte // what the first upstream watch sends after its headers; nil: nothing
		wantUpstream  int32
		wantLocal410s int
	}{
		"stale: one upstream watch, every twin answered locally": {jsonFrames()[2], 1, 4},
		"valid by an event: all go upstream":                     {jsonFrames()[0], 5, 0},
		"valid by a quiet stream: all go upstream":               {nil, 5, 0},
	} {
		t.Run(name, func(t *testing.T) {
			engine := &fakeEngine{}
			engine.decide = func(r *ratelimit.Request) ratelimit.Decision {
				_, _, stale := engine.snapshot()
				if len(stale) > 0 {
					return ratelimit.Decision{Reason: ratelimit.ReasonStaleResourceVersion, Budget: "b"}
				}
				return ratelimit.Decision{Allowed: true, Budget: "b"}
			}
			var upstream atomic.Int32
			first := make(chan struct{})
			px := newTestProxy(t, engine, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := upstream.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(200)
				w.(http.Flusher).Flush()
				if n == 1 {
					<-first // the twins are waiting by now
					if tc.firstEvent != nil {
						_, _ = w.Write(tc.firstEvent)
						w.(http.Flusher).Flush()
					} else {
						time.Sleep(3 * pendingVersionQuietWindow) // quiet, and open
					}
				}
			}))
			var wg sync.WaitGroup
			bodies := make([]string, 5)
			wg.Go(func() {
				_, body := get(t, px, "alice", staleWatchURL)
				bodies[0] = string(body)
			})
			deadline := time.Now().Add(5 * time.Second)
			for upstream.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			for i := 1; i < 5; i++ {
				wg.Go(func() {
					_, body := get(t, px, "alice", staleWatchURL+"&timeoutSeconds=1")
					bodies[i] = string(body)
				})
			}
			// Whether the twins join before the verdict or come after it, the
			// outcome is the same; the pause only makes the first case likely.
			time.Sleep(50 * time.Millisecond)
			close(first)
			wg.Wait()
			if got := upstream.Load(); got != tc.wantUpstream {
				t.Errorf("%d upstream watches, want %d", got, tc.wantUpstream)
			}
			local := 0
			for _, b := range bodies[1:] {
				if strings.Contains(b, "answered by watchgate") {
					local++
				}
			}
			if local != tc.wantLocal410s {
				t.Errorf("%d twins answered locally, want %d (bodies %q)", local, tc.wantLocal410s, bodies)
			}
		})
	}
}

// The table of pending versions is bounded in count and bytes, and keyed
// by the parsed version: "007" and "7" are one version.
func TestPendingVersionsAreBoundedAndParsed(t *testing.T) {
	p := newPendingVersions()
	k1, ok1 := pendingVersionKey(&classification{Verb: ratelimit.VerbWatch, ResourceVersion: "007", Resource: "pods"})
	k2, ok2 := pendingVersionKey(&classification{Verb: ratelimit.VerbWatch, ResourceVersion: "7", Resource: "pods"})
	if !ok1 || !ok2 || k1 != k2 {
		t.Fatalf("keys %v %v, want one key for 007 and 7", k1, k2)
	}
	for _, rv := range []string{"", "0", "x", "-1", "99999999999999999999999"} {
		if _, ok := pendingVersionKey(&classification{Verb: ratelimit.VerbWatch, ResourceVersion: rv, Resource: "pods"}); ok {
			t.Errorf("version %q is held, want it passed", rv)
		}
	}
	ctx := context.Background()
	first, wait := p.join(&twin{ctx: ctx}, k1)
	if first == nil || wait != nil {
		t.Fatal("the first watch must not wait")
	}
	if f, w := p.join(&twin{ctx: ctx}, k2); f != nil || w == nil {
		t.Fatal("a twin must wait")
	}
	first.settle()
	first.abandon()
	if p.len() != 0 || p.bytes != 0 {
		t.Fatalf("%d entries, %d bytes left after settle", p.len(), p.bytes)
	}
	long := strings.Repeat("r", 64<<10)
	n := 0
	for i := range maxPendingVersions + 10 {
		if f, _ := p.join(&twin{ctx: ctx}, versionKey{resource: long, version: uint64(i + 1)}); f != nil {
			n++
		}
	}
	if p.bytes > maxPendingVersionBytes || n >= maxPendingVersions {
		t.Errorf("%d entries of %d bytes held, want at most %d bytes", n, p.bytes, maxPendingVersionBytes)
	}
}

// A watch whose first watch's client has left, and whom no twin waits
// for, does not wait: it takes the first's place. The first's own late
// abandon does not remove its successor.
func TestAWatchDoesNotWaitForAFirstWhoseClientLeft(t *testing.T) {
	p, k, first, leave := firstThatLeaves(t)
	leave()
	next, wait := p.join(&twin{ctx: context.Background()}, k)
	if next == nil || wait != nil {
		t.Fatalf("after the first's client left: first=%v wait=%v, want a new first that does not wait", next, wait)
	}
	first.abandon() // the old first's handler unwinds late
	twinCtx, twinLeaves := context.WithCancel(context.Background())
	if _, w := p.join(&twin{ctx: twinCtx}, k); w != next {
		t.Error("the old first's abandon removed its successor")
	}
	twinLeaves() // so that next's abandon hands its place to nobody
	next.abandon()
	if p.len() != 0 || p.bytes != 0 {
		t.Errorf("%d entries, %d bytes left", p.len(), p.bytes)
	}
}

// The place of a first that learns nothing goes to the twin that has
// waited longest, never to a watch that comes later: a caller that drops
// its first watch and opens the next at once does not get in front of
// the twins that waited. The others wait for the new first, and a twin
// stops waiting after two firsts.
func TestTheLongestWaitingTwinAsksNext(t *testing.T) {
	p, k, first, leave := firstThatLeaves(t)
	defer first.abandon()
	twins := make([]<-chan held, 3)
	for i := range twins {
		twins[i] = holdJoined(t, p, k)
	}
	// The first's client leaves and a newcomer from the same caller asks
	// at once, as an HTTP/2 client that closes a watch and opens the next
	// does: the newcomer finds the first gone under the table's lock,
	// before any twin is scheduled.
	p.mu.Lock()
	leave()
	newcomer := &twin{ctx: context.Background()}
	if f, w := p.joinLocked(newcomer, k); f != nil || w == nil {
		p.mu.Unlock()
		t.Fatalf("the newcomer got first=%v wait=%v, want it to wait behind the twins", f, w)
	}
	p.mu.Unlock()
	oldest := wantAsks(t, twins[0], "the longest-waiting twin")
	wantWaits(t, twins[1], "the second twin")
	wantWaits(t, twins[2], "the third twin")
	oldest.abandon() // it learnt nothing either
	second := wantAsks(t, twins[1], "the second twin")
	// The third has now waited for two firsts: the one it found and the
	// oldest twin; it does not wait for a third.
	wantGoesOnWithoutAsking(t, twins[2], "after two firsts, the third twin")
	second.settle()
	p.mu.Lock()
	defer p.mu.Unlock()
	if newcomer.on != nil || newcomer.first != nil {
		t.Errorf("the newcomer is still among twins (%v) or asks (%v) after a verdict", newcomer.on, newcomer.first)
	}
	if len(p.m) != 0 || p.bytes != 0 {
		t.Errorf("%d entries, %d bytes left", len(p.m), p.bytes)
	}
}

// A twin whose client leaves, or whose wait runs out, leaves the line: it
// is not handed the first's place, and it is not kept. Nor is one whose
// client has left but that has not yet stepped out of the line.
func TestATwinThatLeavesIsNotHandedThePlace(t *testing.T) {
	p := newPendingVersions()
	k := versionKey{resource: "pods", version: 7}
	first, _ := p.join(&twin{ctx: context.Background()}, k)
	ctx, leave := context.WithCancel(context.Background())
	left := holdJoinedWith(t, p, k, ctx, time.Hour)
	timedOut := holdJoinedWith(t, p, k, context.Background(), 50*time.Millisecond)
	goneCtx, gone := context.WithCancel(context.Background())
	notYetOut := &twin{ctx: goneCtx}
	if _, w := p.join(notYetOut, k); w == nil {
		t.Fatal("want the twin to wait")
	}
	stays := holdJoined(t, p, k)
	gone()
	leave()
	if h := <-left; h.ok || h.first != nil {
		t.Errorf("the twin whose client left got first=%v ok=%v, want ok=false", h.first, h.ok)
	}
	if h := <-timedOut; !h.ok || h.first != nil {
		t.Errorf("the twin whose wait ran out got first=%v ok=%v, want to go on without asking", h.first, h.ok)
	}
	first.abandon()
	next := wantAsks(t, stays, "the twin that stayed")
	p.mu.Lock()
	if n := p.m[k].twins.n; n != 0 {
		t.Errorf("%d twins kept, want none", n)
	}
	if notYetOut.first != nil || notYetOut.on != nil {
		t.Errorf("the twin whose client left was handed the place (%v) or kept waiting (%v)", notYetOut.first, notYetOut.on)
	}
	p.mu.Unlock()
	next.settle()
}

// A twin that is already waiting asks in the first's place as soon as the
// first watch's client leaves, before the first watch's handler has
// unwound; a second twin then waits for it, and goes on with its verdict.
func TestATwinAsksWhenTheFirstsClientLeaves(t *testing.T) {
	p, k, first, leave := firstThatLeaves(t)
	defer first.abandon()
	hold := func() <-chan held { return holdInBackground(p, k) }
	waiting := hold()
	select {
	case <-waiting:
		t.Fatal("the twin went on while the first's client was there")
	case <-time.After(20 * time.Millisecond):
	}
	leave()
	var next held
	select {
	case next = <-waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("the twin still waits after the first's client left")
	}
	if !next.ok || next.first == nil {
		t.Fatalf("the twin got first=%v ok=%v, want it to ask in the first's place", next.first, next.ok)
	}
	second := hold()
	select {
	case <-second:
		t.Fatal("a second twin went on while the new first was asking")
	case <-time.After(20 * time.Millisecond):
	}
	next.first.settle()
	wantGoesOnWithoutAsking(t, second, "after a verdict, the second twin")
}

// firstThatLeaves returns a table holding a first watch from pods at
// version 7, whose client leaves when leave is called.
func firstThatLeaves(t *testing.T) (p *pendingVersions, k versionKey, first *pendingVersion, leave context.CancelFunc) {
	t.Helper()
	p = newPendingVersions()
	k = versionKey{resource: "pods", version: 7}
	gone, leave := context.WithCancel(context.Background())
	t.Cleanup(leave)
	if first, _ = p.join(&twin{ctx: gone}, k); first == nil {
		t.Fatal("want a first")
	}
	return p, k, first, leave
}

// A line of twins keeps the order they came in, whichever of them leave.
func TestTwinLineKeepsTheOrder(t *testing.T) {
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
			var l twinLine
			tws := make([]*twin, 4)
			for i := range tws {
				tws[i] = &twin{}
				l.push(tws[i])
			}
			for _, i := range tc.leave {
				l.remove(tws[i])
			}
			var got []int
			for tw := l.head; tw != nil; tw = tw.next {
				got = append(got, slices.Index(tws, tw))
			}
			var back []int
			for tw := l.tail; tw != nil; tw = tw.prev {
				back = append([]int{slices.Index(tws, tw)}, back...)
			}
			if !slices.Equal(got, tc.want) || !slices.Equal(back, tc.want) || l.n != len(tc.want) {
				t.Errorf("line %v (from the tail %v, n=%d), want %v", got, back, l.n, tc.want)
			}
		})
	}
}

type held struct {
	first *pendingVersion
	ok    bool
}

// holdInBackground holds a watch from k with no client deadline and
// sends what hold returned.
func holdInBackground(p *pendingVersions, k versionKey) <-chan held {
	c := make(chan held, 1)
	go func() {
		f, ok := p.hold(context.Background(), k, time.Hour)
		c <- held{f, ok}
	}()
	return c
}

// holdJoined holds a watch from k in the background and returns once it
// waits among the twins.
func holdJoined(t *testing.T, p *pendingVersions, k versionKey) <-chan held {
	t.Helper()
	return holdJoinedWith(t, p, k, context.Background(), time.Hour)
}

// holdJoinedWith is holdJoined for a client context and a longest wait.
func holdJoinedWith(t *testing.T, p *pendingVersions, k versionKey, ctx context.Context, maxWait time.Duration) <-chan held {
	t.Helper()
	waiting := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		if pv := p.m[k]; pv != nil {
			return pv.twins.n
		}
		return 0
	}
	before := waiting()
	c := make(chan held, 1)
	go func() {
		f, ok := p.hold(ctx, k, maxWait)
		c <- held{f, ok}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for waiting() == before {
		if time.Now().After(deadline) {
			t.Fatal("the watch did not join the twins")
		}
		time.Sleep(time.Millisecond)
	}
	return c
}

// wantAsks fails unless the held watch went on, within 5s, as the first
// to ask, and returns what it carries.
func wantAsks(t *testing.T, c <-chan held, who string) *pendingVersion {
	t.Helper()
	select {
	case h := <-c:
		if !h.ok || h.first == nil {
			t.Fatalf("%s got first=%v ok=%v, want it to ask", who, h.first, h.ok)
		}
		return h.first
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
		t.Fatalf("%s went on (first=%v ok=%v), want it to wait", who, h.first, h.ok)
	case <-time.After(20 * time.Millisecond):
	}
}

// wantGoesOnWithoutAsking fails unless the held watch went on, within 5s,
// without being the first to ask.
func wantGoesOnWithoutAsking(t *testing.T, c <-chan held, who string) {
	t.Helper()
	select {
	case h := <-c:
		if !h.ok || h.first != nil {
			t.Errorf("%s got first=%v ok=%v, want it to go on without asking", who, h.first, h.ok)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s still waits", who)
	}
}

// A twin's wait is bounded in all, however many firsts learn nothing, and
// ends when its own client leaves.
func TestATwinsWaitIsBounded(t *testing.T) {
	p := newPendingVersions()
	k := versionKey{resource: "pods", version: 7}
	first, _ := p.join(&twin{ctx: context.Background()}, k)
	defer first.abandon()
	start := time.Now()
	if f, ok := p.hold(context.Background(), k, 30*time.Millisecond); f != nil || !ok {
		t.Errorf("after the longest wait: first=%v ok=%v, want to go on without asking", f, ok)
	}
	if waited := time.Since(start); waited < 30*time.Millisecond {
		t.Errorf("waited %v, want the whole 30ms", waited)
	}
	ctx, leave := context.WithCancel(context.Background())
	leave()
	if _, ok := p.hold(ctx, k, time.Hour); ok {
		t.Error("hold says go on for a client that left")
	}
}

func TestQuietWindowGrowsWithTheSlowest410(t *testing.T) {
	p := newPendingVersions()
	floor := pendingVersionQuietWindow
	steps := []struct {
		observe time.Duration // 0: observe nothing
		want    time.Duration
	}{
		{0, floor},                     // nothing seen: the floor
		{50 * time.Millisecond, floor}, // 2×50ms is under the floor
		{200 * time.Millisecond, 400 * time.Millisecond}, // twice the slowest gap
		{100 * time.Millisecond, 400 * time.Millisecond}, // a faster 410 does not shrink it
		{3 * time.Second, maxPendingVersionQuietWindow},  // capped
	}
	for i, s := range steps {
		if s.observe > 0 {
			p.observeStale(s.observe)
		}
		if got := p.window(floor); got != s.want {
			t.Errorf("step %d (observed %v): window %v, want %v", i, s.observe, got, s.want)
		}
	}
}

// When the first watch from a stale version learns nothing (its client
// left before the API server answered, the API server failed it), its
// twins do not all go upstream: one of them asks in its place and the
// others wait for that one's verdict.
func TestTwinsOfAFirstThatLearntNothingAskOnce(t *testing.T) {
	for name, firstAnswer := range map[string]func(w http.ResponseWriter, r *http.Request){
		"its client left before the answer": func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		},
		"the API server answered 503": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		},
	} {
		t.Run(name, func(t *testing.T) {
			engine := &fakeEngine{}
			engine.decide = func(r *ratelimit.Request) ratelimit.Decision {
				if _, _, stale := engine.snapshot(); len(stale) > 0 {
					return ratelimit.Decision{Reason: ratelimit.ReasonStaleResourceVersion, Budget: "b"}
				}
				return ratelimit.Decision{Allowed: true, Budget: "b"}
			}
			var upstream atomic.Int32
			answer := make(chan struct{})
			px := newTestProxy(t, engine, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if upstream.Add(1) == 1 {
					<-answer // the twins are waiting by now
					firstAnswer(w, r)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(200)
				_, _ = w.Write(jsonFrames()[2])
			}))
			ctx, leave := context.WithCancel(context.Background())
			defer leave()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, px.URL+staleWatchURL, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer alice")
			firstDone := make(chan struct{})
			go func() {
				defer close(firstDone)
				if resp, err := px.Client().Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			deadline := time.Now().Add(5 * time.Second)
			for upstream.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			var wg sync.WaitGroup
			bodies := make([]string, 4)
			for i := range bodies {
				wg.Go(func() {
					_, body := get(t, px, "alice", staleWatchURL)
					bodies[i] = string(body)
				})
			}
			time.Sleep(50 * time.Millisecond) // let the twins join
			if name == "its client left before the answer" {
				leave()
			}
			close(answer)
			wg.Wait()
			<-firstDone
			if got := upstream.Load(); got != 2 {
				t.Errorf("%d upstream watches, want 2 (the first and one twin in its place)", got)
			}
			local := 0
			for _, b := range bodies {
				if strings.Contains(b, "answered by watchgate") {
					local++
				}
			}
			if local != 3 {
				t.Errorf("%d twins answered locally, want 3 (bodies %q)", local, bodies)
			}
		})
	}
}

// A twin waits for at most two firsts: the one it found and one that took
// its place. A caller that queued watches from the version ahead of the
// twin and drops each as it becomes the first holds the twin for two of
// them, not for pendingVersionWait.
func TestATwinWaitsForAtMostTwoFirsts(t *testing.T) {
	p := newPendingVersions()
	k := versionKey{resource: "pods", version: 7}
	first, _ := p.join(&twin{ctx: context.Background()}, k)
	defer first.abandon()
	callers := []<-chan held{holdJoined(t, p, k), holdJoined(t, p, k)}
	waiting := holdJoined(t, p, k)
	first.abandon()
	second := wantAsks(t, callers[0], "the caller's first queued watch")
	wantWaits(t, waiting, "the twin, while its second first asks,")
	second.abandon()
	third := wantAsks(t, callers[1], "the caller's second queued watch")
	defer third.abandon()
	wantGoesOnWithoutAsking(t, waiting, "after two firsts left, the twin")
}
