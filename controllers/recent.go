package controllers

import "time"

// recentWindow is how far back status.recentRejections looks.
const recentWindow = 5 * time.Minute

// rejectionHistory turns a budget's cumulative rejection count into the
// number of rejections in about the last recentWindow. It keeps the totals
// sampled at each status tick (every 15 s: about 21 samples), and one sample
// at or before the start of the window as the baseline; the window is thus
// between recentWindow and recentWindow plus one tick long.
//
// It is used by one goroutine.
type rejectionHistory struct {
	samples []rejectionSample
}

type rejectionSample struct {
	at    time.Time
	total int64
}

// observe records total at now and returns total minus the baseline. The
// first observation takes 0 as its baseline: the engine counts from when the
// budget appeared, which is at most a tick ago. A total lower than the last
// one means the engine's counters started over (the budget was removed and
// added again), so the history does too.
func (h *rejectionHistory) observe(now time.Time, total int64, window time.Duration) int64 {
	if n := len(h.samples); n > 0 && total < h.samples[n-1].total {
		h.samples = nil
	}
	if len(h.samples) == 0 {
		h.samples = append(h.samples, rejectionSample{at: now, total: 0})
	}
	h.samples = append(h.samples, rejectionSample{at: now, total: total})
	cutoff := now.Add(-window)
	drop := 0
	for drop+1 < len(h.samples) && !h.samples[drop+1].at.After(cutoff) {
		drop++
	}
	h.samples = append(h.samples[:0], h.samples[drop:]...)
	return total - h.samples[0].total
}
