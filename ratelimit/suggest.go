package ratelimit

import "math"

// Suggestion says which limits to suggest from what was observed: those
// that would have admitted the observed peaks of Share percent of the
// identities, times HeadroomPercent percent.
type Suggestion struct {
	// Share is a percentage of identities, 1 to 100; 0 is taken as
	// DefaultSuggestionShare.
	Share int32
	// HeadroomPercent multiplies the peaks, 100 to 1000; 0 is taken as
	// DefaultSuggestionHeadroomPercent.
	HeadroomPercent int32
}

// The defaults of Suggestion, the WatchBudget CRD's.
const (
	DefaultSuggestionShare           = 95
	DefaultSuggestionHeadroomPercent = 150
)

// Suggested are limits suggested from observed peaks (see Suggest).
type Suggested struct {
	// WatchOpensPerMinute, WatchBurst and MaxConcurrentWatches are the
	// suggested limits; 0 when no identity opened a watch.
	WatchOpensPerMinute, WatchBurst, MaxConcurrentWatches int32
	// ListsPerMinute is the suggested list rate when the current limits
	// budget lists and some identity listed; 0 otherwise.
	ListsPerMinute int32
	// WouldRefuse is how many observed identities the current limits
	// certainly refused or would have (see Suggest).
	WouldRefuse int64
	// StaleLoops is how many observed identities were answered "too old"
	// locally at least once: a budget whose StaleVersions.Action is
	// StaleReject refuses them whatever its limits.
	StaleLoops int64
	// BackingOff is how many observed identities had a watch refused (or,
	// in DryRun, that would have been) for backoff at least once: their
	// watches kept failing, and backoff holds them back whatever the
	// limits.
	BackingOff int64
	// Identities is how many identities the suggestion rests on.
	Identities int64
}

// Suggest returns the limits that would have admitted the observed peaks
// of s.Share percent of the identities in op, times s.HeadroomPercent
// percent, rounded up, and how many of them the current limits would have
// refused.
//
// Each limit comes from the quantile (PeakSketch.Quantile, over the
// identities that did the thing at all) of its own peak: WatchOpensPerMinute
// from the most opens in a minute, WatchBurst from the most opens in a
// second (and at least current.InitialStateCost, or a watch asking for
// initial state could never be admitted), MaxConcurrentWatches from the
// most watches open at once, ListsPerMinute from the most lists in a
// minute. A suggested rate alone admits an identity's busiest minute, so
// the suggestion errs on the generous side; each is between 1 and 100000.
//
// WouldRefuse counts the identities whose peak certainly exceeds what a
// current limit admits: opens in a minute above WatchOpensPerMinute +
// WatchBurst (a full bucket, refilled for a minute), opens in a second
// above WatchBurst + WatchOpensPerMinute/60, watches at once above
// MaxConcurrentWatches, lists in a minute above ListsPerMinute + ListBurst
// — for each limit that is set. It is the most any one limit refuses,
// since sketches do not tell which identities are the same: a lower bound.
// StaleLoops counts the identities answered stale and BackingOff those
// held back by backoff: no limit changes either, so the suggested limits
// refuse them too. WouldRefuse counts the identities held back by backoff
// as well (the caller adds stale loops when the budget rejects them). The
// suggested limits would have admitted the peaks of s.Share percent of
// the identities but for those.
func Suggest(op *ObservedPeaks, current Limits, s Suggestion) Suggested {
	share, headroom := s.Share, s.HeadroomPercent
	if share <= 0 {
		share = DefaultSuggestionShare
	}
	if headroom <= 0 {
		headroom = DefaultSuggestionHeadroomPercent
	}
	scale := func(sk *PeakSketch) int32 {
		q := sk.Quantile(share)
		if q == 0 {
			return 0
		}
		v := math.Ceil(float64(q) * float64(headroom) / 100)
		return int32(min(max(v, 1), maxRate))
	}
	out := Suggested{
		WatchOpensPerMinute:  scale(&op.WatchOpensPerMinute),
		WatchBurst:           scale(&op.WatchBurst),
		MaxConcurrentWatches: scale(&op.ConcurrentWatches),
		Identities:           op.Identities,
		StaleLoops:           op.StaleAnswersPerMinute.Above(0),
		BackingOff:           op.BackoffRefusalsPerMinute.Above(0),
	}
	if out.WatchBurst > 0 {
		out.WatchBurst = max(out.WatchBurst, current.InitialStateCost)
	}
	if current.ListsPerMinute > 0 {
		out.ListsPerMinute = scale(&op.ListsPerMinute)
	}

	refuse := func(sk *PeakSketch, limit int64) {
		out.WouldRefuse = max(out.WouldRefuse, sk.Above(int32(min(limit, math.MaxInt32))))
	}
	l := &current
	if l.WatchOpensPerMinute > 0 {
		refuse(&op.WatchOpensPerMinute, int64(l.WatchOpensPerMinute)+int64(l.WatchBurst))
		refuse(&op.WatchBurst, int64(l.WatchBurst)+int64(l.WatchOpensPerMinute)/60)
	}
	if l.MaxConcurrentWatches > 0 {
		refuse(&op.ConcurrentWatches, int64(l.MaxConcurrentWatches))
	}
	if l.ListsPerMinute > 0 {
		refuse(&op.ListsPerMinute, int64(l.ListsPerMinute)+int64(l.ListBurst))
	}
	out.WouldRefuse = max(out.WouldRefuse, out.BackingOff)
	return out
}
