package inspect

import (
	"runtime"
	"testing"

	"github.com/watchgate/watchgate/proxy/internal/streamtest"
)

func TestHeldBufferClass(t *testing.T) {
	for _, tc := range []struct{ n, size int }{
		{0, 512}, {1, 512}, {512, 512}, {513, 1024}, {1024, 1024}, {1025, 2048},
		{95 << 10, 128 << 10}, {maxHeldGzipBytes - 1, maxHeldGzipBytes}, {maxHeldGzipBytes, maxHeldGzipBytes},
	} {
		c := heldBufferClass(tc.n)
		if c < 0 || c >= heldBufferClasses || heldBufferSize(c) != tc.size {
			t.Errorf("%d bytes: class %d of %d bytes; want %d bytes", tc.n, c, heldBufferSize(c), tc.size)
		}
		if b := getHeldBuffer(c); cap(*b) != tc.size || len(*b) != 0 {
			t.Errorf("%d bytes: a buffer of len %d, cap %d; want 0, %d", tc.n, len(*b), cap(*b), tc.size)
		}
	}
}

// In a replay the member held changes size after every read; the buffers
// it is held in come back from their pools instead of being made, and the
// budget is charged each buffer's whole capacity and given all of it back.
func TestHeldMembersOfChangingSizesReuseBuffers(t *testing.T) {
	small, large := make([]byte, 2<<10), make([]byte, 90<<10)
	large[len(large)-1] = 7
	g, _ := newTestGzipInspector(t, streamtest.JSONWatchType, maxHeldGzipBytes)
	for range 2 { // fill both classes' pools
		g.hold(small)
		g.hold(large)
	}
	const pairs = 200
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range pairs {
		g.hold(small)
		if len(g.held) != len(small) || cap(g.held) != 2<<10 || g.budget.InUse() != 2<<10 {
			t.Fatalf("small member: %d bytes held in %d, budget used %d", len(g.held), cap(g.held), g.budget.InUse())
		}
		g.hold(large)
		if len(g.held) != len(large) || g.held[len(large)-1] != 7 || g.budget.InUse() != 128<<10 {
			t.Fatalf("large member: %d bytes held in %d, budget used %d", len(g.held), cap(g.held), g.budget.InUse())
		}
	}
	runtime.ReadMemStats(&after)
	// A buffer made per member would be 92 KiB a pair. The race
	// detector's pools drop a quarter of what they are given: about 25 KiB
	// a pair made again under -race, none without.
	if perPair := (after.TotalAlloc - before.TotalAlloc) / pairs; perPair > 48<<10 {
		t.Errorf("%d bytes allocated per pair of members held; want at most 48 KiB", perPair)
	}
	g.Release()
	if g.budget.InUse() != 0 || g.heldBuf != nil {
		t.Errorf("after Release: budget used %d, buffer kept %v", g.budget.InUse(), g.heldBuf != nil)
	}
}
