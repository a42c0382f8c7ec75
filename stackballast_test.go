package main

import (
	"context"
	"runtime"
	"runtime/metrics"
	"testing"
)

// While the ballast is held, the runtime starts new goroutines with at
// least 4 KiB of stack; once it is released, the ballast goroutine is gone.
func TestStackBallastLiftsTheStartingStack(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- StackBallast{}.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start returned %v, want nil", err)
		}
		// Recompute the starting stack without the ballast for the tests
		// after this one.
		runtime.GC()
	})

	// The ballast is in place once its goroutine waits in its frame; a GC
	// that scans it then sets the starting size. Two GCs: the first may
	// have started before the ballast was taken.
	start := []metrics.Sample{{Name: "/gc/stack/starting-size:bytes"}}
	for i := 0; i < 100; i++ {
		runtime.GC()
		runtime.GC()
		metrics.Read(start)
		if start[0].Value.Uint64() >= 4<<10 {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("goroutines start with %d bytes of stack with the ballast held, want at least 4 KiB", start[0].Value.Uint64())
}
