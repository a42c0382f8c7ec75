package main

import "context"

// stackBallastBytes is the stack StackBallast holds.
const stackBallastBytes = 32 << 10

// StackBallast is a manager Runnable that holds stackBallastBytes of
// goroutine stack until the manager stops, so that the goroutines net/http
// starts for every request begin with a 4 KiB stack rather than 2 KiB.
//
// The runtime starts each new goroutine with the average stack in use at
// the last GC, plus its guard, rounded up to a power of two. watchgate is a
// proxy inside an operator: its ~65 idle goroutines (controller-runtime's
// manager and priority queues, informers, probes, the engine's sweep)
// average just over 1 KiB, so new goroutines start at 2 KiB; a bare
// reverse proxy, with a handful of goroutines of its own, starts them at 4
// KiB. The goroutines net/http starts for each request (the HTTP/2
// server's frame writers for the headers and their flush, the HTTP/2
// client's request writer) outgrow 2 KiB on every request, and each growth
// copies the stack: `make bench` measured 395–443 µs of proxy CPU per watch
// open without the ballast against 368–394 µs with it (watchgate ÷ the bare
// proxy 1.26–1.31 against 1.10–1.14), and the CPU profile showed the
// difference in runtime.newstack under net/http's goroutines. The proxy
// grows its handler's own goroutine's stack itself; the ballast covers the
// goroutines watchgate does not start. It tunes the whole process's
// runtime, so it belongs to where the process is assembled, not to the
// data path.
//
// 32 KiB lifts the average into the 4 KiB band (1,120 to 3,168 bytes in use
// on average) for anything from ~15 to ~200 shallow goroutines besides it,
// and costs one 64 KiB stack. A replica with many open watches is there
// anyway, its watches' goroutines set the average, and the ballast is noise.
type StackBallast struct{}

// Start holds the ballast until ctx ends.
func (StackBallast) Start(ctx context.Context) error {
	holdStackBallast(ctx)
	return nil
}

// NeedLeaderElection is false: every replica serves requests.
func (StackBallast) NeedLeaderElection() bool { return false }

// holdStackBallast takes a frame of stackBallastBytes and waits in it for
// ctx to end; the stack below the wait counts as in use at every GC.
//
//go:noinline
func holdStackBallast(ctx context.Context) {
	var ballast [stackBallastBytes]byte
	touch(ballast[:])
	<-ctx.Done()
}

// touch keeps the ballast, and so its frame, from being optimised away (the
// compiler drops an array nothing reads or writes).
//
//go:noinline
func touch(b []byte) { b[0] = 0 }
