package periodic

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// Every calls fn every d on clk until ctx ends, the first time d from now.
// Calls never overlap: like a time.Ticker, a call that takes longer than d
// is followed by the next at once, and the ticks it missed are dropped.
// fn runs on the caller's goroutine; Every returns when ctx ends.
func Every(ctx context.Context, clk clock.Clock, d time.Duration, fn func(context.Context)) {
	loop(ctx, clk, d, false, fn)
}

// NowAndEvery is Every with a first call at once, before the first wait.
func NowAndEvery(ctx context.Context, clk clock.Clock, d time.Duration, fn func(context.Context)) {
	loop(ctx, clk, d, true, fn)
}

func loop(ctx context.Context, clk clock.Clock, d time.Duration, now bool, fn func(context.Context)) {
	t := clk.NewTimer(d)
	defer t.Stop()
	if now {
		fn(ctx)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		// Rearm before the call, so that the interval runs from tick to
		// tick as a time.Ticker's does, not from the end of the call.
		t.Reset(d)
		fn(ctx)
	}
}
