package controllers

import (
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchgate/watchgate/api/v1alpha1"
	wbac "github.com/watchgate/watchgate/api/v1alpha1/applyconfiguration/api/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

// Suggested limits travel in two steps. Each replica publishes the sketch
// of its identities' peaks in its own status entry (observedEntry, written
// by ReplicaStatusWriter); the leader adds up the entries' sketches and
// those of the replicas that are gone (mergeObserved, see suggest_gone.go)
// and writes status.suggested (suggestedLimits, written by
// ReadyReconciler). A sketch is a few counts per bucket and names no
// identity, so status holds no user names but the top offenders'.

// observedEntry is a replica's sketch as its status entry holds it: the
// non-empty buckets of each sketch, and since to the second (as the API
// server keeps it, so that an unchanged sketch compares equal). Nil for an
// empty sketch (an Exempt budget's).
func observedEntry(op *ratelimit.ObservedPeaks) *v1alpha1.ObservedPeaks {
	if op.Since.IsZero() {
		return nil
	}
	buckets := func(s *ratelimit.PeakSketch) []v1alpha1.PeakBucket {
		var out []v1alpha1.PeakBucket
		s.Buckets(func(le int32, n int64) { out = append(out, v1alpha1.PeakBucket{Le: le, Count: n}) })
		return out
	}
	return &v1alpha1.ObservedPeaks{
		Since:                 metav1.NewTime(op.Since.Truncate(time.Second)),
		Identities:            op.Identities,
		WatchOpensPerMinute:   buckets(&op.WatchOpensPerMinute),
		WatchBurst:            buckets(&op.WatchBurst),
		ConcurrentWatches:     buckets(&op.ConcurrentWatches),
		ListsPerMinute:        buckets(&op.ListsPerMinute),
		StaleAnswersPerMinute: buckets(&op.StaleAnswersPerMinute),

		BackoffRefusalsPerMinute: buckets(&op.BackoffRefusalsPerMinute),
	}
}

// sameObserved reports whether two entries' sketches say the same.
func sameObserved(a, b *v1alpha1.ObservedPeaks) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Since.Equal(&b.Since) && a.Identities == b.Identities &&
		slices.Equal(a.WatchOpensPerMinute, b.WatchOpensPerMinute) &&
		slices.Equal(a.WatchBurst, b.WatchBurst) &&
		slices.Equal(a.ConcurrentWatches, b.ConcurrentWatches) &&
		slices.Equal(a.ListsPerMinute, b.ListsPerMinute) &&
		slices.Equal(a.StaleAnswersPerMinute, b.StaleAnswersPerMinute) &&
		slices.Equal(a.BackoffRefusalsPerMinute, b.BackoffRefusalsPerMinute)
}

// observedApply is the apply configuration of a replica's sketch.
func observedApply(o *v1alpha1.ObservedPeaks) *wbac.ObservedPeaksApplyConfiguration {
	a := wbac.ObservedPeaks().WithSince(o.Since).WithIdentities(o.Identities)
	buckets := func(bs []v1alpha1.PeakBucket) []*wbac.PeakBucketApplyConfiguration {
		out := make([]*wbac.PeakBucketApplyConfiguration, len(bs))
		for i, b := range bs {
			out[i] = wbac.PeakBucket().WithLe(b.Le).WithCount(b.Count)
		}
		return out
	}
	if len(o.WatchOpensPerMinute) > 0 {
		a.WithWatchOpensPerMinute(buckets(o.WatchOpensPerMinute)...)
	}
	if len(o.WatchBurst) > 0 {
		a.WithWatchBurst(buckets(o.WatchBurst)...)
	}
	if len(o.ConcurrentWatches) > 0 {
		a.WithConcurrentWatches(buckets(o.ConcurrentWatches)...)
	}
	if len(o.ListsPerMinute) > 0 {
		a.WithListsPerMinute(buckets(o.ListsPerMinute)...)
	}
	if len(o.StaleAnswersPerMinute) > 0 {
		a.WithStaleAnswersPerMinute(buckets(o.StaleAnswersPerMinute)...)
	}
	if len(o.BackoffRefusalsPerMinute) > 0 {
		a.WithBackoffRefusalsPerMinute(buckets(o.BackoffRefusalsPerMinute)...)
	}
	return a
}

// peaksOf is the sketch an entry's observed holds.
func peaksOf(o *v1alpha1.ObservedPeaks) ratelimit.ObservedPeaks {
	add := func(s *ratelimit.PeakSketch, bs []v1alpha1.PeakBucket) {
		for _, b := range bs {
			s.AddBucket(b.Le, b.Count)
		}
	}
	var op ratelimit.ObservedPeaks
	op.Since = o.Since.Time
	op.Identities = max(o.Identities, 0)
	add(&op.WatchOpensPerMinute, o.WatchOpensPerMinute)
	add(&op.WatchBurst, o.WatchBurst)
	add(&op.ConcurrentWatches, o.ConcurrentWatches)
	add(&op.ListsPerMinute, o.ListsPerMinute)
	add(&op.StaleAnswersPerMinute, o.StaleAnswersPerMinute)
	add(&op.BackoffRefusalsPerMinute, o.BackoffRefusalsPerMinute)
	return op
}

// mergeObserved adds up the sketches of the replicas' entries and of the
// replicas that are gone (st.ObservedByGoneReplicas), and reports whether
// there was any.
func mergeObserved(st *v1alpha1.WatchBudgetStatus) (ratelimit.ObservedPeaks, bool) {
	var op ratelimit.ObservedPeaks
	found := false
	if o := st.ObservedByGoneReplicas; o != nil {
		found = true
		op = peaksOf(o)
	}
	for i := range st.Replicas {
		o := st.Replicas[i].Observed
		if o == nil {
			continue
		}
		found = true
		one := peaksOf(o)
		op.Merge(&one)
	}
	return op, found
}

// suggestedLimits is status.suggested for a budget compiled as b, from the
// sketches in its status st: nil when the budget is Exempt or no replica
// observed an identity yet.
func suggestedLimits(b *ratelimit.Budget, st *v1alpha1.WatchBudgetStatus) *v1alpha1.SuggestedLimits {
	if b.Enforcement == ratelimit.Exempt {
		return nil
	}
	op, ok := mergeObserved(st)
	if !ok || op.Identities == 0 {
		return nil
	}
	s := ratelimit.Suggest(&op, b.Limits, b.Suggestion)
	anyway := s.BackingOff
	if b.StaleVersions.Action != ratelimit.StalePass {
		// Answered locally whatever the limits: refused too.
		s.WouldRefuse = max(s.WouldRefuse, s.StaleLoops)
		anyway += s.StaleLoops
	}
	since := metav1.NewTime(op.Since)
	return &v1alpha1.SuggestedLimits{
		Summary:              suggestionSummary(s, b.Limits.ListsPerMinute > 0),
		WatchOpensPerMinute:  s.WatchOpensPerMinute,
		WatchBurst:           s.WatchBurst,
		MaxConcurrentWatches: s.MaxConcurrentWatches,
		ListsPerMinute:       s.ListsPerMinute,
		WouldRefuse:          s.WouldRefuse,
		RefusedAnyway:        anyway,
		Identities:           s.Identities,
		Since:                &since,
	}
}

// suggestionSummary is the SUGGESTED column: "60/min b10 w40", then
// " l20/min" when lists are limited; "-" for a limit nothing was observed
// for.
func suggestionSummary(s ratelimit.Suggested, lists bool) string {
	show := func(v int32) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprint(v)
	}
	out := fmt.Sprintf("%s/min b%s w%s", show(s.WatchOpensPerMinute), show(s.WatchBurst), show(s.MaxConcurrentWatches))
	if lists {
		out += fmt.Sprintf(" l%s/min", show(s.ListsPerMinute))
	}
	return out
}

// sameSuggested reports whether two suggestions say the same.
func sameSuggested(a, b *v1alpha1.SuggestedLimits) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := *a, *b
	x.Since, y.Since = nil, nil
	return x == y && a.Since.Equal(b.Since)
}

// suggestedApply is the apply configuration of status.suggested.
func suggestedApply(s *v1alpha1.SuggestedLimits) *wbac.SuggestedLimitsApplyConfiguration {
	a := wbac.SuggestedLimits().
		WithSummary(s.Summary).
		WithWouldRefuse(s.WouldRefuse).
		WithRefusedAnyway(s.RefusedAnyway).
		WithIdentities(s.Identities)
	if s.WatchOpensPerMinute > 0 {
		a.WithWatchOpensPerMinute(s.WatchOpensPerMinute)
	}
	if s.WatchBurst > 0 {
		a.WithWatchBurst(s.WatchBurst)
	}
	if s.MaxConcurrentWatches > 0 {
		a.WithMaxConcurrentWatches(s.MaxConcurrentWatches)
	}
	if s.ListsPerMinute > 0 {
		a.WithListsPerMinute(s.ListsPerMinute)
	}
	if s.Since != nil {
		a.WithSince(*s.Since)
	}
	return a
}
