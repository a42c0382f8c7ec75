package relay

// handlerStackReserve is the frame growStack reserves: with the frames
// below it and the runtime's guard, the handler goroutine's stack becomes
// 8 KiB, which a watch's handler reaches anyway while it opens (the chain,
// the reverse proxy, the HTTP/2 response writer).
const handlerStackReserve = 4 << 10

// growStack takes a frame of handlerStackReserve bytes, so that the
// runtime grows the stack to fit it on entry. WithRelayAtTop calls it
// first, while the stack holds a few frames.
//
// A new goroutine starts with the runtime's adaptive starting stack: the
// average stack in use at the last GC, 4 KiB in watchgate with the
// process's stack ballast (package main; 2 KiB without it). The handler
// outgrows it on a watch open, and growing deep inside the filters copies
// every frame below the growth point and adjusts its pointers: make bench
// measured 5 µs before authentication and 8 µs inside the wait for a
// pending version (at 2 KiB), of the ~50 µs watchgate spent before
// forwarding. One growth at the top costs under 1 µs. An idle watch's
// stack shrinks back to 4 KiB at a garbage collection (WithRelayAtTop).
//
//go:noinline
func growStack() {
	var reserve [handlerStackReserve]byte
	touch(reserve[:])
}

// touch keeps reserve, and so growStack's frame, from being optimised away.
//
//go:noinline
func touch(b []byte) { b[0] = 0 }
