package periodic

import (
	"context"
	"sync"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

// run starts loop on a fake clock and returns the clock, a channel that
// receives once per call of fn, and a stop function that waits for the
// loop to return.
func run(t *testing.T, now bool, d time.Duration) (*testingclock.FakeClock, <-chan struct{}, func()) {
	t.Helper()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 3, 16, 0, 0, 0, time.UTC))
	calls := make(chan struct{}, 10)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		f := Every
		if now {
			f = NowAndEvery
		}
		f(ctx, clk, d, func(context.Context) { calls <- struct{}{} })
	})
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return clk, calls, stop
}

// called waits (at most 10 s) for one call.
func called(t *testing.T, calls <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-calls:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no call", what)
	}
}

// waitForTimer waits (at most 10 s) until the loop waits on the clock.
func waitForTimer(t *testing.T, clk *testingclock.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the loop never waits on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestEveryCallsOnTheClocksTicks(t *testing.T) {
	const d = 30 * time.Second
	clk, calls, stop := run(t, false, d)
	waitForTimer(t, clk)
	clk.Step(d - time.Nanosecond)
	if len(calls) != 0 {
		t.Fatal("called before the first interval had passed")
	}
	for i := range 3 {
		clk.Step(time.Nanosecond)
		called(t, calls, "tick")
		waitForTimer(t, clk)
		if i < 2 {
			clk.Step(d - time.Nanosecond)
		}
	}
	stop()
	if len(calls) != 0 {
		t.Errorf("%d calls more than the ticks", len(calls))
	}
}

func TestNowAndEveryCallsFirstAtOnce(t *testing.T) {
	const d = time.Minute
	clk, calls, stop := run(t, true, d)
	called(t, calls, "first call, before any time passed")
	waitForTimer(t, clk)
	clk.Step(d)
	called(t, calls, "after one interval")
	stop()
}

func TestEveryReturnsWhenTheContextEnds(t *testing.T) {
	clk, calls, stop := run(t, false, time.Second)
	waitForTimer(t, clk)
	stop() // waits for the loop to return
	clk.Step(time.Hour)
	if len(calls) != 0 {
		t.Error("called after the context ended")
	}
}
