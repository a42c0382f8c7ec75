package proxy

import "net/http"

// handlerStackReserve is the frame growStack reserves: with the frames
// below it and the runtime's guard, the handler goroutine's stack becomes
// 8 KiB, which a watch's handler reaches anyway (the chain, the reverse
// proxy, the HTTP/2 response writer).
const handlerStackReserve = 4 << 10

// withGrownStack grows the handler goroutine's stack once, at the top of
// the chain, before the filters run.
//
// A new goroutine starts with the runtime's adaptive starting stack: the
// average stack in use at the last GC, 4 KiB in watchgate with the
// process's stack ballast (package main; 2 KiB without it). The handler outgrows it on a watch open, and growing
// deep inside the filters copies every frame below the growth point and
// adjusts its pointers: make bench measured 5 µs before authentication and
// 8 µs inside the wait for a pending version (at 2 KiB), of the ~50 µs
// watchgate spent before forwarding. One growth here, while the stack holds
// a few frames, costs under 1 µs; the stack an open watch keeps is the
// same 8 KiB (make bench's heap profiles: 12.4 KiB of stacks per open watch
// either way, the same as the bare proxy's).
func withGrownStack(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		growStack()
		next.ServeHTTP(w, r)
	})
}

// growStack takes a frame of handlerStackReserve bytes, so that the
// runtime grows the stack to fit it on entry.
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
