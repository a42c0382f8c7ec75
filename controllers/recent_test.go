package controllers

import (
	"testing"
	"time"
)

func TestRejectionHistory(t *testing.T) {
	const tick = 15 * time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ticks int) time.Time { return t0.Add(time.Duration(ticks) * tick) }
	var h rejectionHistory
	for i, step := range []struct {
		at    time.Time
		total int64
		want  int64
	}{
		{at(0), 4, 4}, // first sight: everything since the budget appeared
		{at(1), 10, 10},
		{at(2), 10, 10},
		{at(19), 12, 12},
		{at(20), 12, 8}, // the 4 counted at t0 are 5 minutes old: 12-4
		{at(21), 12, 2}, // and so are the 6 counted at t0+15s
		{at(22), 12, 2},
		{at(42), 12, 0}, // nothing for 5 minutes
		{at(43), 3, 3},  // counters went down: the budget came back, start over
		{at(44), 5, 5},
	} {
		if got := h.observe(step.at, step.total, recentWindow); got != step.want {
			t.Errorf("step %d (t0+%s, total %d): recent = %d, want %d", i, step.at.Sub(t0), step.total, got, step.want)
		}
	}
	if n := len(h.samples); n > int(recentWindow/tick)+2 {
		t.Errorf("history holds %d samples, want at most a window's worth", n)
	}
}
