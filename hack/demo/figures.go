package main

import (
	"fmt"
	"math"
	"time"
)

// counterSample is a cumulative counter read at one instant, since the
// storm started.
type counterSample struct {
	at    time.Duration
	value float64
}

// ratePoint is the rate of a counter over one window.
type ratePoint struct {
	at        time.Duration // the middle of the window, since the storm started
	perSecond float64
}

// alignedRates turns counter samples taken at uneven instants into the
// rate over windows of one length that start at 0, window, 2·window…: the
// counter at each window's edges is interpolated linearly between the
// samples on either side, so a window holds the requests of its own span,
// whatever instants the samples fell on. (A rate between consecutive
// samples swings with the sampling jitter: 3 samples in one second and 5 in
// the next read as a saw-tooth.) Only windows the samples cover entirely
// are returned. The samples must be in time order.
func alignedRates(samples []counterSample, window time.Duration) []ratePoint {
	if len(samples) < 2 || window <= 0 {
		return nil
	}
	first, last := samples[0].at, samples[len(samples)-1].at
	var points []ratePoint
	for start := time.Duration(0); start+window <= last; start += window {
		if start < first {
			continue
		}
		a, b := valueAt(samples, start), valueAt(samples, start+window)
		points = append(points, ratePoint{at: start + window/2, perSecond: (b - a) / window.Seconds()})
	}
	return points
}

// valueAt interpolates the counter at t, within the samples' span.
func valueAt(samples []counterSample, t time.Duration) float64 {
	for i := 1; i < len(samples); i++ {
		s0, s1 := samples[i-1], samples[i]
		if t > s1.at {
			continue
		}
		if s1.at == s0.at {
			return s1.value
		}
		f := float64(t-s0.at) / float64(s1.at-s0.at)
		return s0.value + f*(s1.value-s0.value)
	}
	return samples[len(samples)-1].value
}

// aboveBaseline is what a storm cost on top of a quiet period of the same
// length: the difference, or 0 when the storm's figure is within the quiet
// period's (the difference is then the machine's noise, not a saving).
func aboveBaseline(storm, baseline float64) float64 {
	return max(0, storm-baseline)
}

// count says "1 upstream WATCH" or "20 upstream WATCHes": n, rounded to a
// whole number, with the noun's plural for anything but one.
func count(n float64, one, many string) string {
	n = math.Round(n)
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%.0f %s", n, many)
}

// share prints part ÷ whole as a fraction "1/n" (n rounded) when part is
// at most whole, "1/∞" when part is 0, and "2.4×" when part is larger.
func share(part, whole float64) string {
	switch {
	case part <= 0:
		return "1/∞"
	case part > whole:
		return fmt.Sprintf("%.1f×", part/whole)
	}
	return fmt.Sprintf("1/%.0f", whole/part)
}
