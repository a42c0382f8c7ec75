package controllers

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

// observedOf is a sketch of identities with the given watch opens per
// minute (each with a burst of 1 and 1 watch at once, no lists).
func observedOf(since time.Time, opens ...int64) ratelimit.ObservedPeaks {
	op := ratelimit.ObservedPeaks{Since: since}
	for _, v := range opens {
		op.Identities++
		op.WatchOpensPerMinute.Add(v)
		op.WatchBurst.Add(1)
		op.ConcurrentWatches.Add(1)
		op.ListsPerMinute.Add(0)
		op.StaleAnswersPerMinute.Add(0)
		op.BackoffRefusalsPerMinute.Add(0)
	}
	return op
}

// Replicas' entries carry their sketches as buckets; the leader adds them
// up into the sketch of all their identities, from the earliest since.
func TestObservedEntriesMerge(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := observedOf(t0.Add(1500*time.Millisecond), 5, 5, 5)
	b := observedOf(t0.Add(time.Hour), 5, 60)
	ea, eb := observedEntry(&a), observedEntry(&b)
	if !ea.Since.Time.Equal(t0.Add(time.Second)) {
		t.Errorf("since %v, want it to the second, %v", ea.Since, t0.Add(time.Second))
	}
	if want := []v1alpha1.PeakBucket{{Le: 5, Count: 3}}; len(ea.WatchOpensPerMinute) != 1 || ea.WatchOpensPerMinute[0] != want[0] {
		t.Errorf("a's opens buckets %v, want %v", ea.WatchOpensPerMinute, want)
	}
	if ea.ListsPerMinute[0] != (v1alpha1.PeakBucket{Le: 0, Count: 3}) {
		t.Errorf("a's list buckets %v, want 3 identities at 0", ea.ListsPerMinute)
	}
	merged, ok := mergeObserved(&v1alpha1.WatchBudgetStatus{Replicas: []v1alpha1.ReplicaStatus{{Pod: "a", Observed: ea}, {Pod: "c"}, {Pod: "b", Observed: eb}}})
	if !ok {
		t.Fatal("no sketch found")
	}
	whole := observedOf(t0.Add(time.Second), 5, 5, 5, 5, 60)
	if merged != whole {
		t.Errorf("merged sketch differs from the sketch of all five identities:\n%+v\n%+v", merged, whole)
	}
	if _, ok := mergeObserved(&v1alpha1.WatchBudgetStatus{Replicas: []v1alpha1.ReplicaStatus{{Pod: "c"}}}); ok {
		t.Error("entries without sketches merged into one")
	}
	if observedEntry(&ratelimit.ObservedPeaks{}) != nil {
		t.Error("an empty sketch (an Exempt budget's) has an entry")
	}
}

// The suggestion, its column and when there is none.
func TestSuggestedLimits(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	op := observedOf(t0, 5, 5, 5, 5, 5, 5, 5, 5, 5, 60)
	replicas := []v1alpha1.ReplicaStatus{{Pod: "a", Observed: observedEntry(&op)}}
	b := ratelimit.Budget{Name: "b", Enforcement: ratelimit.DryRun,
		Limits:     ratelimit.Limits{WatchOpensPerMinute: 20, WatchBurst: 5, InitialStateCost: 1, ListsPerMinute: 10, ListBurst: 10},
		Suggestion: ratelimit.Suggestion{Share: 90, HeadroomPercent: 200}}
	got := suggestedLimits(&b, &v1alpha1.WatchBudgetStatus{Replicas: replicas})
	since := metav1.NewTime(t0)
	want := &v1alpha1.SuggestedLimits{Summary: "10/min b2 w2 l-/min", WatchOpensPerMinute: 10, WatchBurst: 2, MaxConcurrentWatches: 2,
		WouldRefuse: 1, Identities: 10, Since: &since}
	if !sameSuggested(got, want) {
		t.Errorf("suggested %+v, want %+v", got, want)
	}
	b.Enforcement = ratelimit.Exempt
	if got := suggestedLimits(&b, &v1alpha1.WatchBudgetStatus{Replicas: replicas}); got != nil {
		t.Errorf("an Exempt budget got a suggestion: %+v", got)
	}
	b.Enforcement = ratelimit.Enforce
	if got := suggestedLimits(&b, &v1alpha1.WatchBudgetStatus{Replicas: []v1alpha1.ReplicaStatus{{Pod: "a"}}}); got != nil {
		t.Errorf("a suggestion from no sketch: %+v", got)
	}
}

// A sketch's buckets changing alone waits for the counter refresh, like the
// decision counts; one more identity observed is written at once.
func TestNeedsWriteObserved(t *testing.T) {
	const refresh = 5 * time.Minute
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	entry := func(at time.Duration, opens ...int64) v1alpha1.ReplicaStatus {
		st := ratelimit.BudgetStats{TrackedIdentities: 1, Observed: observedOf(t0, opens...)}
		return replicaEntry("pod-a", 1, st, 0, t0.Add(at))
	}
	written := entry(0, 5)
	for _, step := range []struct {
		next v1alpha1.ReplicaStatus
		want bool
		why  string
	}{
		{entry(15*time.Second, 5), false, "nothing changed"},
		{entry(15*time.Second, 40), false, "a peak climbed: waits"},
		{entry(refresh, 40), true, "a peak climbed, refreshed"},
		{entry(15*time.Second, 5, 1), true, "one more identity"},
	} {
		if got := needsWrite(written, step.next, refresh); got != step.want {
			t.Errorf("%s: needsWrite = %v, want %v", step.why, got, step.want)
		}
	}
}

// Identities caught in stale loops are refused whatever the limits:
// wouldRefuse counts them while the budget rejects stale versions, not
// when it passes them to the API server.
func TestSuggestedLimitsCountStaleLoops(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	op := observedOf(t0, 5, 5, 5, 5)
	// Three of them were answered "too old" locally, up to 90 times a
	// minute, and stayed within the limits otherwise.
	op.StaleAnswersPerMinute = ratelimit.PeakSketch{}
	for _, v := range []int64{0, 90, 90, 12} {
		op.StaleAnswersPerMinute.Add(v)
	}
	replicas := []v1alpha1.ReplicaStatus{{Pod: "a", Observed: observedEntry(&op)}}
	b := ratelimit.Budget{Name: "b", Enforcement: ratelimit.DryRun, Limits: ratelimit.Limits{WatchOpensPerMinute: 60, WatchBurst: 30, InitialStateCost: 1}}
	if got := suggestedLimits(&b, &v1alpha1.WatchBudgetStatus{Replicas: replicas}); got == nil || got.WouldRefuse != 3 {
		t.Errorf("stale loops rejected: %+v, want wouldRefuse 3", got)
	}
	b.StaleVersions.Action = ratelimit.StalePass
	if got := suggestedLimits(&b, &v1alpha1.WatchBudgetStatus{Replicas: replicas}); got == nil || got.WouldRefuse != 0 {
		t.Errorf("stale versions passed: %+v, want wouldRefuse 0", got)
	}
}

// Identities held back by backoff are refused whatever the limits:
// wouldRefuse counts them, and refusedAnyway adds them to the stale loops
// the suggested limits refuse too.
func TestSuggestedLimitsCountBackoff(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	op := observedOf(t0, 5, 5, 5, 5)
	// Two had watches refused for backoff (their watches kept dying), one
	// of them was answered "too old" as well.
	op.BackoffRefusalsPerMinute, op.StaleAnswersPerMinute = ratelimit.PeakSketch{}, ratelimit.PeakSketch{}
	for _, v := range []int64{0, 0, 30, 2} {
		op.BackoffRefusalsPerMinute.Add(v)
	}
	for _, v := range []int64{0, 0, 0, 7} {
		op.StaleAnswersPerMinute.Add(v)
	}
	entry := observedEntry(&op)
	if want := []v1alpha1.PeakBucket{{Le: 0, Count: 2}, {Le: 2, Count: 1}, {Le: 31, Count: 1}}; !slices.Equal(entry.BackoffRefusalsPerMinute, want) {
		t.Errorf("backoff buckets %v, want %v", entry.BackoffRefusalsPerMinute, want)
	}
	replicas := []v1alpha1.ReplicaStatus{{Pod: "a", Observed: entry}}
	if merged, _ := mergeObserved(&v1alpha1.WatchBudgetStatus{Replicas: replicas}); merged.BackoffRefusalsPerMinute.Above(0) != 2 {
		t.Errorf("merged sketch: %d identities backed off, want 2", merged.BackoffRefusalsPerMinute.Above(0))
	}
	b := ratelimit.Budget{Name: "b", Enforcement: ratelimit.DryRun, Limits: ratelimit.Limits{WatchOpensPerMinute: 60, WatchBurst: 30, InitialStateCost: 1}}
	if got := suggestedLimits(&b, &v1alpha1.WatchBudgetStatus{Replicas: replicas}); got == nil || got.WouldRefuse != 2 || got.RefusedAnyway != 3 {
		t.Errorf("backoff and a stale loop: %+v, want wouldRefuse 2, refusedAnyway 3", got)
	}
	b.StaleVersions.Action = ratelimit.StalePass
	if got := suggestedLimits(&b, &v1alpha1.WatchBudgetStatus{Replicas: replicas}); got == nil || got.WouldRefuse != 2 || got.RefusedAnyway != 2 {
		t.Errorf("stale versions passed: %+v, want wouldRefuse 2, refusedAnyway 2", got)
	}
}
