package inspect

import (
	"math/bits"
	"sync"
)

// The buffers a Gzip holds members in come in size classes, powers of two
// from minHeldBuffer to maxHeldGzipBytes, each class pooled: in a replay
// the member held changes after every read, from a few hundred bytes to a
// hundred KiB, and a buffer made for each would be zeroed and collected
// each time.
const (
	minHeldBufferShift = 9
	minHeldBuffer      = 1 << minHeldBufferShift
	heldBufferClasses  = maxHeldGzipBytesShift - minHeldBufferShift + 1
)

var heldBuffers [heldBufferClasses]sync.Pool

// heldBufferClass is the class of the smallest buffer that holds n bytes,
// n ≤ maxHeldGzipBytes.
func heldBufferClass(n int) int {
	if n <= minHeldBuffer {
		return 0
	}
	return bits.Len(uint(n-1)) - minHeldBufferShift
}

// heldBufferSize is the capacity of the buffers of class c.
func heldBufferSize(c int) int { return minHeldBuffer << c }

// getHeldBuffer returns an empty buffer of class c from its pool.
func getHeldBuffer(c int) *[]byte {
	if b, ok := heldBuffers[c].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, heldBufferSize(c))
	return &b
}

// putHeldBuffer returns b, which getHeldBuffer gave, to its pool.
func putHeldBuffer(b *[]byte) {
	*b = (*b)[:0]
	heldBuffers[heldBufferClass(cap(*b))].Put(b)
}
