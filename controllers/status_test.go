package controllers

import (
	"strings"
	"testing"
	"time"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

func TestReplicaEntry(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := ratelimit.BudgetStats{
		ActiveWatches: 3, TrackedIdentities: 2,
		Decisions:    map[ratelimit.Reason]int64{"Allowed": 10, ratelimit.ReasonRateLimited: 4, ratelimit.ReasonBackingOff: 0},
		TopOffenders: []ratelimit.Offender{{User: "alice", Rejections: 4}},
	}
	e := replicaEntry("pod-a", 7, st, 4, t0)
	if e.Pod != "pod-a" || e.ObservedGeneration != 7 || e.ActiveWatches != 3 || e.TrackedIdentities != 2 || e.RecentRejections != 4 {
		t.Errorf("entry = %+v", e)
	}
	if len(e.Decisions) != 2 || e.Decisions["Allowed"] != 10 || e.Decisions["RateLimited"] != 4 {
		t.Errorf("decisions = %v, want the non-zero counts", e.Decisions)
	}
	if len(e.TopOffenders) != 1 || e.TopOffenders[0] != (v1alpha1.Offender{User: "alice", Rejections: 4}) {
		t.Errorf("topOffenders = %v", e.TopOffenders)
	}
	if got := rejections(st); got != 4 {
		t.Errorf("rejections = %d, want 4 (Allowed is not one)", got)
	}

}

// A timeline of one entry at a 15 s tick and a 5 min counter refresh: only
// a change of anything but the cumulative counts writes at once.
func TestNeedsWrite(t *testing.T) {
	const refresh = 5 * time.Minute
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	stats := func(allowed, active int64) ratelimit.BudgetStats {
		return ratelimit.BudgetStats{ActiveWatches: active, TrackedIdentities: 1, Decisions: map[ratelimit.Reason]int64{"Allowed": allowed}}
	}
	written := replicaEntry("pod-a", 7, stats(10, 3), 0, t0)
	for _, step := range []struct {
		at      time.Duration
		allowed int64
		active  int64
		gen     int64
		want    bool
	}{
		{at: 15 * time.Second, allowed: 10, active: 3, gen: 7, want: false},                // lastUpdateTime alone
		{at: 30 * time.Second, allowed: 50, active: 3, gen: 7, want: false},                // busy: counts alone wait
		{at: 4*time.Minute + 45*time.Second, allowed: 900, active: 3, gen: 7, want: false}, // still under refresh
		{at: refresh, allowed: 950, active: 3, gen: 7, want: true},                         // counts refreshed
		{at: 45 * time.Second, allowed: 51, active: 4, gen: 7, want: true},                 // a watch more
		{at: 45 * time.Second, allowed: 10, active: 3, gen: 8, want: true},                 // a new generation
	} {
		next := replicaEntry("pod-a", step.gen, stats(step.allowed, step.active), 0, t0.Add(step.at))
		if got := needsWrite(written, next, refresh); got != step.want {
			t.Errorf("at +%s with %d allowed, %d active, generation %d: needsWrite = %v, want %v", step.at, step.allowed, step.active, step.gen, got, step.want)
		}
	}
	other := written
	other.TopOffenders = []v1alpha1.Offender{{User: "alice", Rejections: 1}}
	if !needsWrite(written, other, refresh) {
		t.Error("a new offender did not need a write")
	}
}

func TestReplicaFieldOwner(t *testing.T) {
	if got := replicaFieldOwner("watchgate-7d9f-abcde"); got != "watchgate-replica-watchgate-7d9f-abcde" {
		t.Errorf("replicaFieldOwner = %q", got)
	}
	long1, long2 := strings.Repeat("a", 200)+"1", strings.Repeat("a", 200)+"2"
	o1, o2 := replicaFieldOwner(long1), replicaFieldOwner(long2)
	if len(o1) > 128 || len(o2) > 128 {
		t.Errorf("field managers longer than 128: %d, %d", len(o1), len(o2))
	}
	if o1 == o2 {
		t.Error("two long pod names share a field manager")
	}
}

func TestSums(t *testing.T) {
	a, r := sums([]v1alpha1.ReplicaStatus{{ActiveWatches: 2, RecentRejections: 5}, {ActiveWatches: 3, RecentRejections: 1}})
	if a != 5 || r != 6 {
		t.Errorf("sums = %d, %d; want 5, 6", a, r)
	}
}
