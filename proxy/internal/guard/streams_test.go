package guard

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// A stream whose write to its client does not move for the stall timeout
// is cut, and only it: not one whose writes progress, not one idle
// between writes (nothing to write), not one already closed.
func TestStreamsCutStalledWrites(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := NewStreams(10*time.Second, 0)
	var cuts sync.Map
	open := func(name string) *Stream {
		return s.Open("tenant", false, func() { cuts.Store(name, true) })
	}
	stalled, moving, idle, closed := open("stalled"), open("moving"), open("idle"), open("closed")
	defer stalled.Close()
	defer moving.Close()
	defer idle.Close()
	stalled.Writing(100)
	closed.Writing(100)
	for i := range 10 {
		moving.Writing(10)
		moving.Wrote(10)
		moving.Writing(10) // a write is in progress at every sweep, each a new one
		if n := s.Sweep(t0.Add(time.Duration(i)*time.Second), false); n != 0 {
			t.Fatalf("sweep %d cut %d streams before the timeout", i, n)
		}
		moving.Wrote(10)
		if i == 5 {
			closed.Close()
		}
	}
	if n := s.Sweep(t0.Add(10*time.Second), false); n != 1 {
		t.Errorf("%d streams cut after 10s, want the stalled one", n)
	}
	for _, name := range []string{"moving", "idle", "closed"} {
		if _, ok := cuts.Load(name); ok {
			t.Errorf("%s was cut", name)
		}
	}
	if _, ok := cuts.Load("stalled"); !ok || !stalled.WasCut() {
		t.Error("the stalled stream was not cut")
	}
}

// Bytes are accounted per caller and given back when a stream closes,
// however many the stream still holds; a caller with no stream left has
// no entry.
func TestStreamsAccountPerCaller(t *testing.T) {
	s := NewStreams(time.Minute, 0)
	a1, a2, b := s.Open("a", false, nil), s.Open("a", true, nil), s.Open("b", false, nil)
	a1.AddBuffered(100)
	a2.Writing(50)
	b.AddBuffered(7)
	if got := s.CallerBuffered("a"); got != 150 {
		t.Errorf("a holds %d, want 150", got)
	}
	if got := s.BufferedBytes(); got != 157 {
		t.Errorf("in all %d, want 157", got)
	}
	a1.Close()
	a2.Close()
	a2.Close()
	if got := s.CallerBuffered("a"); got != 0 {
		t.Errorf("a holds %d after closing its streams, want 0", got)
	}
	if _, ok := s.callers["a"]; ok {
		t.Error("a caller without streams keeps an entry")
	}
	b.Close()
	if got := s.BufferedBytes(); got != 0 || s.n != 0 || s.head != nil {
		t.Errorf("after every close: %d bytes, %d streams", got, s.n)
	}
}

// Above the memory mark the guard refuses the caller holding the most
// (bytes buffered and streams) and anyone holding at least the average,
// and admits the others; below it, a caller is refused only at its share
// of buffered bytes (an eighth of the mark).
func TestGuardAboveTheMarkRefusesTheBiggestHolderOnly(t *testing.T) {
	var inUse atomic.Uint64
	inUse.Store(100 * MiB)
	g := New(0, 0, 85, func() (uint64, uint64) { return inUse.Load(), 1000 * MiB }, clocktesting.NewFakePassiveClock(time.Now()))
	g.Streams = NewStreams(time.Minute, 2)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	hog := g.Streams.Open("hog", false, nil)
	defer hog.Close()
	hog.AddBuffered(50 * MiB)
	victim := g.Streams.Open("victim", false, nil)
	defer victim.Close()
	if r, _ := g.Admit(now, "hog"); r != "" {
		t.Errorf("below the mark and its share the hog's watch: %q, want admitted", r)
	}
	g.Release("hog")

	hog.AddBuffered(60 * MiB) // 110 MiB: over an eighth of 850 MiB
	now = now.Add(time.Second)
	if r, _ := g.Admit(now, "hog"); r != GuardBufferedBytes {
		t.Errorf("the hog at its share of buffered bytes: %q, want %q", r, GuardBufferedBytes)
	}
	if _, r, _ := g.AdmitList(now, "hog", nil); r != GuardBufferedBytes {
		t.Errorf("the hog's list at its share of buffered bytes: %q, want %q", r, GuardBufferedBytes)
	}

	inUse.Store(900 * MiB) // above 85%
	now = now.Add(time.Second)
	for _, caller := range []string{"victim", "newcomer"} {
		if r, _ := g.Admit(now, caller); r != "" {
			t.Errorf("above the mark %s's watch: %q, want admitted", caller, r)
		}
		g.Release(caller)
		st, r, _ := g.AdmitList(now, caller, nil)
		if r != "" {
			t.Errorf("above the mark %s's list: %q, want admitted", caller, r)
		} else {
			st.Close()
		}
	}
	hog.AddBuffered(-110 * MiB) // under its share: the mark alone refuses it
	if r, _ := g.Admit(now, "hog"); r != GuardMemoryHighWater {
		t.Errorf("above the mark, the hog (%d bytes): %q, want %q", g.Streams.CallerBuffered("hog"), r, GuardMemoryHighWater)
	}
	if _, r, _ := g.AdmitList(now, "hog", nil); r != GuardMemoryHighWater {
		t.Errorf("above the mark, the hog's list: %q, want %q", r, GuardMemoryHighWater)
	}
}

// With nothing accounted (a Guard without Streams, or no stream open),
// the mark refuses everyone, as memory in use is nobody's in particular.
func TestGuardAboveTheMarkWithNothingHeldRefusesEveryone(t *testing.T) {
	read := func() (uint64, uint64) { return 900 * MiB, 1000 * MiB }
	for name, streams := range map[string]*Streams{"without Streams": nil, "with no stream open": NewStreams(time.Minute, 0)} {
		g := New(0, 0, 85, read, clocktesting.NewFakePassiveClock(time.Now()))
		g.Streams = streams
		if r, _ := g.Admit(time.Now(), "anyone"); r != GuardMemoryHighWater {
			t.Errorf("%s: %q, want %q", name, r, GuardMemoryHighWater)
		}
	}
}

// A caller's lists in flight are capped, concurrent ones included, and a
// list that ends frees its place.
func TestGuardCapsListsPerCaller(t *testing.T) {
	g := New(0, 0, 85, noMemory, clocktesting.NewFakePassiveClock(time.Now()))
	g.Streams = NewStreams(time.Minute, 3)
	var mu sync.Mutex
	var admitted []*Stream
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if st, r, _ := g.AdmitList(time.Now(), "lister", nil); r == "" {
				mu.Lock()
				admitted = append(admitted, st)
				mu.Unlock()
			} else if r != GuardMaxListsPerIdentity {
				t.Errorf("refused for %q, want %q", r, GuardMaxListsPerIdentity)
			}
		})
	}
	wg.Wait()
	if len(admitted) != 3 {
		t.Fatalf("%d of 20 concurrent lists admitted under a cap of 3", len(admitted))
	}
	if st, r, _ := g.AdmitList(time.Now(), "other", nil); r != "" {
		t.Errorf("another caller's list: %q, want admitted", r)
	} else {
		st.Close()
	}
	admitted[0].Close()
	if st, r, _ := g.AdmitList(time.Now(), "lister", nil); r != "" {
		t.Errorf("after a list ended: %q, want admitted", r)
	} else {
		st.Close()
	}
}

// Above the mark a sweep cuts the stalled streams of the caller holding
// the most bytes, before the stall timeout, and no one else's.
func TestStreamsAboveTheMarkCutTheBiggestHoldersStalledStreams(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := NewStreams(time.Hour, 0)
	var hogCut, otherCut atomic.Bool
	hog := s.Open("hog", false, func() { hogCut.Store(true) })
	defer hog.Close()
	other := s.Open("other", false, func() { otherCut.Store(true) })
	defer other.Close()
	hog.AddBuffered(10 * MiB)
	hog.Writing(32 << 10)
	other.Writing(32 << 10)
	s.Sweep(t0, true) // first sight of both writes
	if n := s.Sweep(t0.Add(time.Second), true); n != 1 || !hogCut.Load() || otherCut.Load() {
		t.Errorf("cut %d; hog cut %v, other cut %v; want the hog's only", n, hogCut.Load(), otherCut.Load())
	}
}

// WriteCutter fails a write blocked on a client that does not read, and
// the writes after it.
func TestWriteCutterFailsTheWrite(t *testing.T) {
	started := make(chan func())
	done := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
		started <- WriteCutter(w)
		chunk := make([]byte, 64<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				done <- err
				return
			}
		}
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // never read until cut
	cut := <-started
	time.Sleep(100 * time.Millisecond) // let the write block: not a timing assertion
	cut()
	select {
	case err := <-done:
		if err == nil {
			t.Error("the cut write succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the blocked write was not cut")
	}
}

// A namespace's service accounts are one tenant for bytes and lists as for
// watches: minting accounts does not multiply the share, while a service
// account of another namespace and a user keep their own.
func TestStreamsSharePerTenant(t *testing.T) {
	g := New(0, 0, 85, noMemory, clocktesting.NewFakePassiveClock(time.Now()))
	g.Streams = NewStreams(time.Minute, 2)
	now := time.Now()
	var open []*Stream
	defer func() {
		for _, st := range open {
			st.Close()
		}
	}()
	for _, sa := range []string{"system:serviceaccount:tenant:a", "system:serviceaccount:tenant:b"} {
		st, r, _ := g.AdmitList(now, sa, nil)
		if r != "" {
			t.Fatalf("%s's first list: %q, want admitted", sa, r)
		}
		open = append(open, st)
	}
	if _, r, _ := g.AdmitList(now, "system:serviceaccount:tenant:c", nil); r != GuardMaxListsPerIdentity {
		t.Errorf("a third account of the namespace: %q, want %q (the tenant's lists are at the cap)", r, GuardMaxListsPerIdentity)
	}
	for _, other := range []string{"system:serviceaccount:other:a", "alice"} {
		st, r, _ := g.AdmitList(now, other, nil)
		if r != "" {
			t.Errorf("%s: %q, want admitted", other, r)
			continue
		}
		open = append(open, st)
	}

	share := g.bufferedShare(g.memory.at(now))
	w := g.Streams.Open("system:serviceaccount:tenant:d", false, nil)
	open = append(open, w)
	w.AddBuffered(int(share))
	if r, _ := g.AdmitFlow(now, FlowOf("system:serviceaccount:tenant:e", "")); r != GuardBufferedBytes {
		t.Errorf("another account of a namespace holding its share: %q, want %q", r, GuardBufferedBytes)
	}
	if got := g.Streams.CallerBuffered("system:serviceaccount:tenant:a"); got != share {
		t.Errorf("the tenant holds %d, want %d", got, share)
	}
}
