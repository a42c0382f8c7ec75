package proxy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
)

// sweepingEngine reports each Sweep's instant.
type sweepingEngine struct {
	enginetest.Engine
	swept chan time.Time
}

func (e *sweepingEngine) Sweep(now time.Time) int { e.swept <- now; return 0 }

// The engine's sweep runs on Options.Clock: every SweepInterval of that
// clock, at that clock's time.
func TestSweepFollowsTheOptionsClock(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 16, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakeClock(t0)
	e := &sweepingEngine{swept: make(chan time.Time, 1)}
	s := &Server{opts: Options{Engine: e, Clock: clk, SweepInterval: 30 * time.Second}, log: logr.Discard()}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.sweep(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	for i := 1; i <= 2; i++ {
		deadline := time.Now().Add(10 * time.Second)
		for !clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("the sweep does not wait on Options.Clock")
			}
			time.Sleep(time.Millisecond)
		}
		clk.Step(30 * time.Second)
		select {
		case at := <-e.swept:
			if want := t0.Add(time.Duration(i) * 30 * time.Second); !at.Equal(want) {
				t.Errorf("sweep %d at %s, want %s", i, at, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no sweep %d after SweepInterval on the fake clock", i)
		}
	}
}
