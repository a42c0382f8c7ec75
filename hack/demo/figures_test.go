package main

import (
	"math"
	"testing"
	"time"
)

func TestAlignedRates(t *testing.T) {
	s := time.Second
	ms := time.Millisecond
	for name, tc := range map[string]struct {
		samples []counterSample
		window  time.Duration
		want    []ratePoint
	}{
		"a steady 200/s sampled at uneven instants is a flat 200/s": {
			samples: []counterSample{{0, 0}, {300 * ms, 60}, {500 * ms, 100}, {1100 * ms, 220}, {1250 * ms, 250}, {2050 * ms, 410}},
			window:  s,
			want:    []ratePoint{{500 * ms, 200}, {1500 * ms, 200}},
		},
		"each window counts its own span: 100 in the first second, 300 in the second": {
			samples: []counterSample{{0, 0}, {1 * s, 100}, {2 * s, 400}},
			window:  s,
			want:    []ratePoint{{500 * ms, 100}, {1500 * ms, 300}},
		},
		"a window the samples do not cover entirely is left out": {
			samples: []counterSample{{200 * ms, 0}, {2500 * ms, 230}},
			window:  s,
			want:    []ratePoint{{1500 * ms, 100}},
		},
		"half-second windows of a counter that stops": {
			samples: []counterSample{{0, 0}, {500 * ms, 50}, {1 * s, 50}},
			window:  500 * ms,
			want:    []ratePoint{{250 * ms, 100}, {750 * ms, 0}},
		},
		"one sample gives no rate": {
			samples: []counterSample{{0, 5}},
			window:  s,
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := alignedRates(tc.samples, tc.window)
			if len(got) != len(tc.want) {
				t.Fatalf("alignedRates = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i].at != tc.want[i].at || math.Abs(got[i].perSecond-tc.want[i].perSecond) > 1e-9 {
					t.Errorf("point %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// Rates between consecutive samples saw-tooth when the samples' spacing
// jitters; aligned windows of the same requests do not.
func TestAlignedRatesDoNotSawTooth(t *testing.T) {
	var samples []counterSample
	at := time.Duration(0)
	for i := range 40 {
		samples = append(samples, counterSample{at: at, value: 200 * at.Seconds()})
		at += []time.Duration{180 * time.Millisecond, 320 * time.Millisecond}[i%2]
	}
	points := alignedRates(samples, time.Second)
	if len(points) < 5 {
		t.Fatalf("%d points, want the storm's seconds", len(points))
	}
	for _, p := range points {
		if math.Abs(p.perSecond-200) > 1e-6 {
			t.Errorf("at %s: %.1f/s, want 200/s", p.at, p.perSecond)
		}
	}
}

func TestAboveBaseline(t *testing.T) {
	for _, tc := range []struct{ storm, baseline, want float64 }{
		{2.9, 0.8, 2.1},
		{0.8, 0.8, 0},
		{0.7, 0.8, 0}, // noise, not a saving
	} {
		if got := aboveBaseline(tc.storm, tc.baseline); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("aboveBaseline(%v, %v) = %v, want %v", tc.storm, tc.baseline, got, tc.want)
		}
	}
}

func TestCount(t *testing.T) {
	for _, tc := range []struct {
		n    float64
		want string
	}{
		{1, "1 upstream WATCH"},
		{0, "0 upstream WATCHes"},
		{2, "2 upstream WATCHes"},
		{1993, "1993 upstream WATCHes"},
		{1.2, "1 upstream WATCH"},
	} {
		if got := count(tc.n, "upstream WATCH", "upstream WATCHes"); got != tc.want {
			t.Errorf("count(%v) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestShare(t *testing.T) {
	for _, tc := range []struct {
		part, whole float64
		want        string
	}{
		{0.5, 10, "1/20"},
		{0.26, 1.2, "1/5"},
		{0, 3, "1/∞"},
		{2.42, 1.0, "2.4×"},
	} {
		if got := share(tc.part, tc.whole); got != tc.want {
			t.Errorf("share(%v, %v) = %q, want %q", tc.part, tc.whole, got, tc.want)
		}
	}
}
