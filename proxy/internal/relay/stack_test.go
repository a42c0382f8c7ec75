package relay

import (
	"runtime/metrics"
	"testing"
	"unsafe"
)

// growStack moves a new goroutine's stack once, to a size that the
// frames a watch's handler adds below it fit in without moving it again.
func TestGrowStackGrowsOnceAtTheTop(t *testing.T) {
	start := []metrics.Sample{{Name: "/gc/stack/starting-size:bytes"}}
	metrics.Read(start)
	if s := start[0].Value.Uint64(); s >= 8<<10 {
		t.Fatalf("goroutines start with %d bytes of stack here; the test needs less than 8 KiB", s)
	}
	type moves struct{ grow, deeper bool }
	got := make(chan moves)
	go func() {
		var x byte
		before := uintptr(unsafe.Pointer(&x))
		growStack()
		grown := uintptr(unsafe.Pointer(&x))
		deeperFrame()
		got <- moves{grow: before != grown, deeper: grown != uintptr(unsafe.Pointer(&x))}
	}()
	m := <-got
	if !m.grow {
		t.Error("growStack did not grow the stack")
	}
	if m.deeper {
		t.Error("a 3 KiB frame below growStack's caller grew the stack again")
	}
}

//go:noinline
func deeperFrame() {
	var b [3 << 10]byte
	touch(b[:])
}
