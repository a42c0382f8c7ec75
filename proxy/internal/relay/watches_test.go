package relay

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
)

// Shutdown closes open watches one by one, evenly over the grace period,
// and refuses new ones from its start.
func TestCloseSpread(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	o := NewOpenWatches()
	stoppedAt := map[*Watch]time.Time{}
	var list []*Watch
	for range 4 {
		ctx, cancel := context.WithCancel(context.Background())
		ws := &Watch{clientCtx: ctx}
		ws.cancel = func() { stoppedAt[ws] = clk.Now(); cancel() }
		if !o.Add(ws) {
			t.Fatal("add refused before shutdown")
		}
		list = append(list, ws)
	}
	o.Remove(list[3]) // ended on its own

	o.CloseSpread(clk, 9*time.Second)

	if len(stoppedAt) != 3 {
		t.Fatalf("stopped %d watches, want the 3 open ones", len(stoppedAt))
	}
	seen := map[time.Duration]bool{}
	for ws, at := range stoppedAt {
		if !ws.stopped.Load() || !ws.clientGone() {
			t.Error("a stopped watch does not count as ended by the proxy")
		}
		seen[at.Sub(t0)] = true
	}
	for _, want := range []time.Duration{0, 3 * time.Second, 6 * time.Second} {
		if !seen[want] {
			t.Errorf("no watch stopped at +%v; stopped at %v", want, seen)
		}
	}
	if o.Add(&Watch{}) {
		t.Error("a new watch was admitted after shutdown began")
	}
}

func TestSampledLoggerCountsWhatItDrops(t *testing.T) {
	var lines []string
	log := sampledlog.New(logtest.Func(func(msg string) { lines = append(lines, msg) }), 1e-9, 2)
	for range 10 {
		log.Info("storm")
	}
	if len(lines) != 2 || log.Suppressed.Load() != 8 {
		t.Fatalf("logged %d lines, suppressed %d; want 2, 8", len(lines), log.Suppressed.Load())
	}
}
