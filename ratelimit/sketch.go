package ratelimit

import (
	"math/bits"
	"unsafe"
)

// PeakSketch counts identities by one observed peak (watch opens in a
// minute, say) in fixed log-scale buckets: one per value from 0 to 15, then
// eight per power of two up to 2^17−1, the largest value it tells apart
// (larger peaks count in the last bucket). A bucket is named by its upper
// bound, Le: 0…15 exactly, then 17, 19, … 31, 35, 39, … 63, 71, …, so a
// value is rounded up by less than an eighth. Every sketch has the same
// buckets, so sketches merge by adding counts — one replica's with
// another's, or live identities' with evicted ones' — and the merge of
// sketches is the sketch of the union. A sketch holds counts only, never
// an identity.
//
// A PeakSketch is sketchBuckets·8 = 960 bytes (TestPeakSketchSize); its
// zero value is empty. It is not safe for simultaneous use.
type PeakSketch struct {
	counts [sketchBuckets]int64
}

const (
	// sketchExact is the number of small values kept exactly.
	sketchExact = 16
	// sketchSubBits: 2^sketchSubBits buckets per power of two above them.
	sketchSubBits = 3
	// sketchMaxBits: values below 2^sketchMaxBits are told apart; the CRD's
	// limits go up to 100000.
	sketchMaxBits = 17
	sketchBuckets = sketchExact + (sketchMaxBits-4)<<sketchSubBits
	// sketchMax is the largest value a sketch tells apart.
	sketchMax = 1<<sketchMaxBits - 1
)

// PeakSketchBytes is the size of a PeakSketch.
const PeakSketchBytes = int(unsafe.Sizeof(PeakSketch{}))

// sketchIndex is the bucket of v; negative values count as 0, values above
// sketchMax as sketchMax.
func sketchIndex(v int64) int {
	switch {
	case v < sketchExact:
		return int(max(v, 0))
	case v > sketchMax:
		v = sketchMax
	}
	e := 63 - bits.LeadingZeros64(uint64(v)) // 4 ≤ e < sketchMaxBits
	sub := int(v>>(e-sketchSubBits)) & (1<<sketchSubBits - 1)
	return sketchExact + (e-4)<<sketchSubBits + sub
}

// sketchLe is the upper bound of bucket i: the largest value it counts.
func sketchLe(i int) int32 {
	if i < sketchExact {
		return int32(i)
	}
	e := 4 + (i-sketchExact)>>sketchSubBits
	sub := (i - sketchExact) & (1<<sketchSubBits - 1)
	lo := int32(1<<sketchSubBits+sub) << (e - sketchSubBits)
	return lo + 1<<(e-sketchSubBits) - 1
}

// sketchLow is the lower bound of bucket i: the smallest value it counts.
func sketchLow(i int) int32 {
	if i == 0 {
		return 0
	}
	return sketchLe(i-1) + 1
}

// Add counts one identity whose peak is v.
func (s *PeakSketch) Add(v int64) { s.counts[sketchIndex(v)]++ }

// AddBucket counts n identities in the bucket whose upper bound is le, as
// Buckets reports them (a value that is no bucket's upper bound counts in
// the bucket that holds it). Negative n counts nothing.
func (s *PeakSketch) AddBucket(le int32, n int64) {
	if n > 0 {
		s.counts[sketchIndex(int64(le))] += n
	}
}

// Merge adds o's counts to s.
func (s *PeakSketch) Merge(o *PeakSketch) {
	for i, n := range o.counts {
		s.counts[i] += n
	}
}

// Count is the number of identities counted, those with peak 0 included.
func (s *PeakSketch) Count() int64 {
	var n int64
	for _, c := range s.counts {
		n += c
	}
	return n
}

// Active is the number of identities counted with a peak above 0: those
// that did the thing at all.
func (s *PeakSketch) Active() int64 { return s.Count() - s.counts[0] }

// Buckets calls f with the upper bound and count of every non-empty
// bucket, in increasing order.
func (s *PeakSketch) Buckets(f func(le int32, n int64)) {
	for i, n := range s.counts {
		if n > 0 {
			f(sketchLe(i), n)
		}
	}
}

// Quantile returns the smallest bucket upper bound at or below which the
// peaks of at least percent (1–100) of the active identities lie — those
// with a peak above 0 — or 0 when none is active. Identities that never did
// the thing are left out, so that, say, identities that only list do not
// make the watch quantile smaller. As a bucket's upper bound, it is at
// least the peak it stands for, and less than an eighth above it.
func (s *PeakSketch) Quantile(percent int32) int32 {
	active := s.Active()
	if active == 0 {
		return 0
	}
	percent = min(max(percent, 1), 100)
	// rank is ⌈active·percent/100⌉, the rank of the peak that must fit.
	rank := (active*int64(percent) + 99) / 100
	var seen int64
	for i := 1; i < sketchBuckets; i++ {
		seen += s.counts[i]
		if seen >= rank {
			return sketchLe(i)
		}
	}
	return sketchLe(sketchBuckets - 1)
}

// Above returns how many identities certainly had a peak above limit: those
// in buckets whose every value exceeds it. An identity in the bucket that
// holds limit itself is not counted, so the figure is a lower bound, off by
// at most that bucket's identities (none for limits below 16).
func (s *PeakSketch) Above(limit int32) int64 {
	var n int64
	for i := sketchBuckets - 1; i >= 0 && sketchLow(i) > limit; i-- {
		n += s.counts[i]
	}
	return n
}
