package ratelimit

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// Every value lands in a bucket whose bounds hold it, less than an eighth
// below its upper bound; buckets are contiguous and increasing.
func TestPeakSketchBuckets(t *testing.T) {
	for v := int64(0); v <= sketchMax; v++ {
		i := sketchIndex(v)
		lo, le := int64(sketchLow(i)), int64(sketchLe(i))
		if v < lo || v > le {
			t.Fatalf("%d in bucket %d = [%d, %d]", v, i, lo, le)
		}
		if v >= sketchExact && float64(le-v) >= float64(v)/8 {
			t.Fatalf("%d rounds up to %d: an eighth or more", v, le)
		}
	}
	for i := 1; i < sketchBuckets; i++ {
		if sketchLow(i) != sketchLe(i-1)+1 {
			t.Fatalf("bucket %d starts at %d, bucket %d ends at %d", i, sketchLow(i), i-1, sketchLe(i-1))
		}
	}
	for v, want := range map[int64]int{-5: 0, 0: 0, 15: 15, 16: 16, sketchMax + 1: sketchBuckets - 1, 1 << 40: sketchBuckets - 1} {
		if got := sketchIndex(v); got != want {
			t.Errorf("sketchIndex(%d) = %d, want %d", v, got, want)
		}
	}
	if sketchLe(sketchBuckets-1) != sketchMax {
		t.Errorf("last bucket ends at %d, want %d", sketchLe(sketchBuckets-1), sketchMax)
	}
}

// A timeline of identities added to one sketch, and what it answers after
// each: the quantile is over identities with a peak above 0, and the
// number above a limit counts only buckets wholly above it.
func TestPeakSketchTimeline(t *testing.T) {
	var s PeakSketch
	steps := []struct {
		add        []int64
		count      int64
		q50, q95   int32
		above5     int64
		above60    int64
		commentary string
	}{
		{nil, 0, 0, 0, 0, 0, "empty: no quantile"},
		{[]int64{0, 0, 0}, 3, 0, 0, 0, 0, "identities that never did it are not active"},
		{[]int64{5}, 4, 5, 5, 0, 0, "one active identity is every quantile"},
		{[]int64{5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5}, 23, 5, 5, 0, 0, "20 at 5"},
		{[]int64{60}, 24, 5, 5, 1, 0, "1 of 21 at 60 is past the 95th percentile: ⌈0.95·21⌉ = 20"},
		{[]int64{60}, 25, 5, 63, 2, 0, "2 of 22 at 60 are not: ⌈0.95·22⌉ = 21; [60, 63] holds 60, so not certainly above it"},
		{[]int64{100000, 1 << 30}, 27, 5, 106495, 4, 2, "100000 rounds up to its bucket's bound; 2^30 counts in the last bucket"},
	}
	for i, st := range steps {
		for _, v := range st.add {
			s.Add(v)
		}
		if got := s.Count(); got != st.count {
			t.Errorf("step %d (%s): Count = %d, want %d", i, st.commentary, got, st.count)
		}
		if got := s.Quantile(50); got != st.q50 {
			t.Errorf("step %d (%s): Quantile(50) = %d, want %d", i, st.commentary, got, st.q50)
		}
		if got := s.Quantile(95); got != st.q95 {
			t.Errorf("step %d (%s): Quantile(95) = %d, want %d", i, st.commentary, got, st.q95)
		}
		if got := s.Above(5); got != st.above5 {
			t.Errorf("step %d (%s): Above(5) = %d, want %d", i, st.commentary, got, st.above5)
		}
		if got := s.Above(60); got != st.above60 {
			t.Errorf("step %d (%s): Above(60) = %d, want %d", i, st.commentary, got, st.above60)
		}
	}
	// Out-of-range shares are clamped.
	if got, want := s.Quantile(0), s.Quantile(1); got != want {
		t.Errorf("Quantile(0) = %d, want Quantile(1) = %d", got, want)
	}
	if got, want := s.Quantile(1000), s.Quantile(100); got != want {
		t.Errorf("Quantile(1000) = %d, want Quantile(100) = %d", got, want)
	}
}

// Sketches of any split of identities merge into the sketch of all of
// them, whether merged directly or through their buckets (as replicas
// publish them), and the quantile of the merge is within a bucket of the
// exact quantile.
func TestPeakSketchMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		n := 1 + rng.IntN(500)
		values := make([]int64, n)
		for i := range values {
			values[i] = int64(rng.ExpFloat64() * 40)
		}
		var whole, merged, viaBuckets PeakSketch
		parts := make([]PeakSketch, 1+rng.IntN(5))
		for _, v := range values {
			whole.Add(v)
			parts[rng.IntN(len(parts))].Add(v)
		}
		for i := range parts {
			merged.Merge(&parts[i])
			parts[i].Buckets(viaBuckets.AddBucket)
		}
		if merged != whole || viaBuckets != whole {
			t.Fatalf("round %d: merged sketches differ from the whole", round)
		}
		var active []int64
		for _, v := range values {
			if v > 0 {
				active = append(active, v)
			}
		}
		slices.Sort(active)
		for _, p := range []int32{1, 50, 90, 95, 99, 100} {
			got := whole.Quantile(p)
			if len(active) == 0 {
				if got != 0 {
					t.Fatalf("round %d: Quantile(%d) of nothing active = %d", round, p, got)
				}
				continue
			}
			exact := active[(len(active)*int(p)+99)/100-1]
			if got != sketchLe(sketchIndex(exact)) {
				t.Fatalf("round %d: Quantile(%d) = %d, want the upper bound of %d's bucket, %d", round, p, got, exact, sketchLe(sketchIndex(exact)))
			}
		}
	}
}

// Published buckets that are not bucket upper bounds (another version's,
// or hand-written) still count, in the bucket that holds them; negative
// counts do not.
func TestPeakSketchAddBucket(t *testing.T) {
	var s PeakSketch
	s.AddBucket(61, 2)
	s.AddBucket(7, -3)
	s.AddBucket(-1, 1)
	if s.Count() != 3 || s.Quantile(100) != 63 || s.Active() != 2 {
		t.Errorf("count %d, active %d, Quantile(100) %d; want 3, 2, 63", s.Count(), s.Active(), s.Quantile(100))
	}
}

// The memory a sketch and an observation cost, as their docs state.
func TestObservationSize(t *testing.T) {
	if PeakSketchBytes != 960 {
		t.Errorf("a PeakSketch is %d bytes; its doc says 960", PeakSketchBytes)
	}
	if observationBytes != 64 {
		t.Errorf("an observation is %d bytes; ObservedPeaks's doc says 64", observationBytes)
	}
	t.Logf("per identity: %d B; per budget: %d B", observationBytes, 6*PeakSketchBytes)
}
