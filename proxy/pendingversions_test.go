package proxy

import (
	"context"
	"io"
	"net/http"
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
	first, wait := p.join(ctx, k1)
	if first == nil || wait != nil {
		t.Fatal("the first watch must not wait")
	}
	if f, w := p.join(ctx, k2); f != nil || w == nil {
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
		if f, _ := p.join(ctx, versionKey{resource: long, version: uint64(i + 1)}); f != nil {
			n++
		}
	}
	if p.bytes > maxPendingVersionBytes || n >= maxPendingVersions {
		t.Errorf("%d entries of %d bytes held, want at most %d bytes", n, p.bytes, maxPendingVersionBytes)
	}
}

// A watch whose first watch's client has left does not wait: it takes the
// first's place, and whoever waited on the first is released at once.
// The first's own late abandon does not remove its successor.
func TestAWatchDoesNotWaitForAFirstWhoseClientLeft(t *testing.T) {
	p := newPendingVersions()
	k := versionKey{resource: "pods", version: 7}
	gone, leave := context.WithCancel(context.Background())
	first, _ := p.join(gone, k)
	_, twinWait := p.join(context.Background(), k)
	if first == nil || twinWait == nil {
		t.Fatal("want a first and a waiting twin")
	}
	leave()
	next, wait := p.join(context.Background(), k)
	if next == nil || wait != nil {
		t.Fatalf("after the first's client left: first=%v wait=%v, want a new first that does not wait", next, wait)
	}
	select {
	case <-twinWait.done:
	default:
		t.Error("the twin still waits on a first whose client left")
	}
	first.abandon() // the old first's handler unwinds late
	if _, w := p.join(context.Background(), k); w == nil {
		t.Error("the old first's abandon removed its successor")
	}
	next.abandon()
	if p.len() != 0 || p.bytes != 0 {
		t.Errorf("%d entries, %d bytes left", p.len(), p.bytes)
	}
}

// A twin that is already waiting asks in the first's place as soon as the
// first watch's client leaves, before the first watch's handler has
// unwound; a second twin then waits for it, and goes on with its verdict.
func TestATwinAsksWhenTheFirstsClientLeaves(t *testing.T) {
	p := newPendingVersions()
	k := versionKey{resource: "pods", version: 7}
	gone, leave := context.WithCancel(context.Background())
	first, _ := p.join(gone, k)
	defer first.abandon()
	hold := func() <-chan held { return holdInBackground(p, k) }
	twin := hold()
	select {
	case <-twin:
		t.Fatal("the twin went on while the first's client was there")
	case <-time.After(20 * time.Millisecond):
	}
	leave()
	var next held
	select {
	case next = <-twin:
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
	first, _ := p.join(context.Background(), k)
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
// its place. A caller that keeps opening and dropping watches from the
// version others wait on, each taking the first's place before they can,
// holds them for two of its watches, not for pendingVersionWait.
func TestATwinWaitsForAtMostTwoFirsts(t *testing.T) {
	p := newPendingVersions()
	k := versionKey{resource: "pods", version: 7}
	firstCtx, leaveFirst := context.WithCancel(context.Background())
	defer leaveFirst()
	if f, _ := p.join(firstCtx, k); f == nil {
		t.Fatal("want a first")
	}
	heldBefore := counterValue(t, watchesHeld)
	twin := holdInBackground(p, k)
	for counterValue(t, watchesHeld) == heldBefore {
		time.Sleep(time.Millisecond)
	}
	// takeOver leaves the current first and puts a new first in its
	// place, under the table's lock: the twin, woken by the leaving, cannot
	// join in between.
	takeOver := func(leave context.CancelFunc) context.CancelFunc {
		ctx, next := context.WithCancel(context.Background())
		p.mu.Lock()
		defer p.mu.Unlock()
		leave()
		if f, w := p.joinLocked(ctx, k); f == nil || w != nil {
			t.Fatal("the newcomer did not take the place of a first whose client left")
		}
		return next
	}
	leaveSecond := takeOver(leaveFirst)
	defer leaveSecond()
	select {
	case h := <-twin:
		t.Fatalf("the twin went on (first=%v ok=%v) while its second first was asking", h.first, h.ok)
	case <-time.After(100 * time.Millisecond): // and it has joined the second by now
	}
	leaveThird := takeOver(leaveSecond)
	defer leaveThird()
	wantGoesOnWithoutAsking(t, twin, "after two firsts left, the twin")
}
