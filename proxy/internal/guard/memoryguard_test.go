package guard

import (
	"math"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

const MiB = 1 << 20

func TestMemoryAbove(t *testing.T) {
	for name, tc := range map[string]struct {
		inUse, limit uint64
		fraction     float64
		want         bool
	}{
		"below the mark":                                   {inUse: 300 * MiB, limit: 460 * MiB, fraction: 0.85},
		"above the mark":                                   {inUse: 400 * MiB, limit: 460 * MiB, fraction: 0.85, want: true},
		"exactly at the mark is not above":                 {inUse: 85 * MiB, limit: 100 * MiB, fraction: 0.85},
		"no memory check without a limit (GOMEMLIMIT off)": {inUse: 10 << 30, fraction: 0.85},
		"a mark of 100% is never passed":                   {inUse: 2 * MiB, limit: MiB, fraction: 1},
		"a mark of 0 is never passed":                      {inUse: 2 * MiB, limit: MiB},
	} {
		t.Run(name, func(t *testing.T) {
			s := &MemorySample{inUse: tc.inUse, limit: tc.limit}
			if got := s.above(tc.fraction); got != tc.want {
				t.Errorf("above(%v) = %v, want %v", tc.fraction, got, tc.want)
			}
		})
	}
}

// The memory reader is called at most once per sample interval, however
// many watches open; a new sample is taken once the interval has passed.
func TestMemorySamplerReadsOncePerInterval(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var reads atomic.Int32
	var inUse atomic.Uint64
	inUse.Store(10 * MiB)
	m := newMemorySampler(func() (uint64, uint64) { reads.Add(1); return inUse.Load(), 100 * MiB })

	if s := m.at(t0); s.inUse != 10*MiB {
		t.Fatalf("t0: %d MiB, want 10", s.inUse>>20)
	}
	inUse.Store(90 * MiB) // not sampled yet
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() { m.at(t0.Add(100 * time.Millisecond)) })
	}
	wg.Wait()
	if n := reads.Load(); n != 1 {
		t.Errorf("%d reads within one interval, want 1", n)
	}
	if s := m.at(t0.Add(memorySampleInterval)); s.inUse != 90*MiB {
		t.Errorf("after the interval: %d MiB, want 90", s.inUse>>20)
	}
}

// RuntimeMemory reads the real runtime: some memory in use, and the limit
// set with debug.SetMemoryLimit (GOMEMLIMIT) or none.
func TestRuntimeMemory(t *testing.T) {
	inUse, limit := RuntimeMemory()
	if inUse < MiB || inUse > 1<<40 {
		t.Errorf("in use %d bytes: not a plausible reading", inUse)
	}
	if limit == math.MaxInt64 {
		t.Errorf("limit %d: an unset limit must read as 0", limit)
	}
}

// RuntimeMemory counts what the last collection left live and not the
// garbage made since: a replica whose watches churn is not refused for
// memory the collector frees as the limit nears.
func TestRuntimeMemoryCountsLiveMemoryNotGarbage(t *testing.T) {
	// No collection while the garbage is made, as between two collections
	// under GOMEMLIMIT.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	runtime.GC()
	before, _ := RuntimeMemory()
	var sink []byte
	for range 256 {
		sink = make([]byte, 256<<10) // 64 MiB in all, each dropped at once
		sink[0] = 1
	}
	garbage, _ := RuntimeMemory()
	if garbage > before+16*MiB {
		t.Errorf("64 MiB of garbage: in use %d MiB → %d MiB, want it uncounted", before/MiB, garbage/MiB)
	}
	kept := make([][]byte, 0, 256)
	for range 256 {
		b := make([]byte, 256<<10)
		b[0] = 1
		kept = append(kept, b)
	}
	runtime.GC()
	live, _ := RuntimeMemory()
	if live < before+56*MiB {
		t.Errorf("64 MiB kept live through a collection: in use %d MiB → %d MiB, want it counted", before/MiB, live/MiB)
	}
	runtime.KeepAlive(kept)
	runtime.KeepAlive(sink)
}

// Above the high-water mark the guard has garbage collected, in the
// background, at most once per interval and one at a time; the next
// sample is then read at once, so that the memory freed admits watches
// again without waiting out the sample interval.
func TestMemoryGuardCollectsGarbageAboveTheMark(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var inUse atomic.Uint64
	inUse.Store(95 * MiB)
	release := make(chan struct{})
	var collections atomic.Int32
	g := New(0, 0, 85, func() (uint64, uint64) { return inUse.Load(), 100 * MiB }, clocktesting.NewFakePassiveClock(t0))
	m := g.memory
	m.collect = func() {
		collections.Add(1)
		<-release
		inUse.Store(60 * MiB) // the garbage is gone
	}

	if reason, _ := g.Admit(t0, "alice"); reason != GuardMemoryHighWater {
		t.Fatalf("at 95%% of the limit: %q, want %s", reason, GuardMemoryHighWater)
	}
	// While the collection runs, more refusals start no other one.
	for i := range 10 {
		if reason, _ := g.Admit(t0.Add(time.Duration(i)*time.Millisecond), "bob"); reason != GuardMemoryHighWater {
			t.Fatalf("still above the mark: %q", reason)
		}
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for m.collecting.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := collections.Load(); n != 1 {
		t.Fatalf("%d collections, want 1", n)
	}
	// Read anew at once, within the sample interval of the last reading.
	if reason, _ := g.Admit(t0.Add(20*time.Millisecond), "alice"); reason != "" {
		t.Errorf("after the collection: refused %q, want admitted", reason)
	}
	// Above the mark again within the interval: no new collection.
	inUse.Store(95 * MiB)
	m.sample.Store(&MemorySample{})
	if reason, _ := g.Admit(t0.Add(time.Second), "alice"); reason != GuardMemoryHighWater {
		t.Fatalf("at 95%% again: %q", reason)
	}
	if n := collections.Load(); n != 1 {
		t.Errorf("%d collections within %s, want 1", n, memoryCollectInterval)
	}
	// After the interval, one more.
	if reason, _ := g.Admit(t0.Add(memoryCollectInterval+time.Second), "alice"); reason != GuardMemoryHighWater {
		t.Fatalf("at 95%% after the interval: %q", reason)
	}
	for m.collecting.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := collections.Load(); n != 2 {
		t.Errorf("%d collections after the interval, want 2", n)
	}
}
