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

	later := replicaEntry("pod-a", 7, st, 4, t0.Add(time.Minute))
	if !sameFigures(e, later) {
		t.Error("entries that differ only in lastUpdateTime are not the same figures")
	}
	st.Decisions["Allowed"]++
	if sameFigures(e, replicaEntry("pod-a", 7, st, 4, t0)) {
		t.Error("a new decision did not change the figures")
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
