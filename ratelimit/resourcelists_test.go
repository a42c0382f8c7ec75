package ratelimit

import (
	"fmt"
	"testing"
)

func listOf(user, resource string) *Request {
	return &Request{User: user, Verb: VerbList, Resource: resource}
}

// An agent that rebuilds one resource in a loop runs out of that
// resource's rebuild tokens; its lists of other resources, and their
// further pages, still go through, and so do other identities' lists of
// the looping resource.
func TestOneResourcesRebuildsCannotStarveTheOthers(t *testing.T) {
	e := newTestEngine(t, Options{}, Budget{Name: "b", Limits: Limits{
		WatchOpensPerMinute: 600, WatchBurst: 100, InitialStateCost: 1,
		ListsPerMinute: 600, ListBurst: 20,
		ListsPerMinutePerResource: 6, ListBurstPerResource: 3,
	}})
	for i := range 3 {
		expect(t, fmt.Sprint("rebuild ", i), e.Decide(t0, listOf("agent", "pods")), true, "", 0)
	}
	// The fourth rebuild of pods in the same instant: one token every 10s.
	expect(t, "pods again", e.Decide(t0, listOf("agent", "pods")), false, ReasonResourceListsLimited, 10*s)
	// A watch-list of pods is a rebuild too; a watch from a version is not.
	expect(t, "pods watch-list", e.Decide(t0, watchListOf("agent", "", "pods")), false, ReasonResourceListsLimited, 10*s)
	expect(t, "pods watch from a version", e.Decide(t0, resumeOf("agent", "", "pods")), true, "", 0)
	next := listOf("agent", "pods")
	next.Continuation = true
	expect(t, "a further page of pods", e.Decide(t0, next), true, "", 0)
	// The agent's other resources, and another identity's pods.
	for _, res := range []string{"configmaps", "secrets", "services", "nodes", "namespaces", "endpoints", "deployments", "leases", "roles"} {
		expect(t, res, e.Decide(t0, listOf("agent", res)), true, "", 0)
	}
	expect(t, "another identity's pods", e.Decide(t0, listOf("other", "pods")), true, "", 0)
	// 10s later pods has one token again; the refused rebuilds took none.
	expect(t, "pods after 10s", e.Decide(t0.Add(10*s), listOf("agent", "pods")), true, "", 0)
	expect(t, "pods at once again", e.Decide(t0.Add(10*s), listOf("agent", "pods")), false, ReasonResourceListsLimited, 10*s)
	if got := e.Stats()["b"].Decisions[ReasonResourceListsLimited]; got != 3 {
		t.Errorf("Decisions[%s] = %d, want 3", ReasonResourceListsLimited, got)
	}
}

// Beyond resourceListSlots resources partly spent at once, the rest share
// one bucket: limited together, never unlimited. A full bucket's slot is
// taken over by the next resource.
func TestRebuildBucketsBeyondTheSlotsShareOne(t *testing.T) {
	e := newTestEngine(t, Options{}, Budget{Name: "b", Limits: Limits{ListsPerMinutePerResource: 6, ListBurstPerResource: 1}})
	for i := range resourceListSlots {
		expect(t, fmt.Sprint("own slot ", i), e.Decide(t0, listOf("agent", fmt.Sprint("r", i))), true, "", 0)
	}
	expect(t, "first beyond the slots", e.Decide(t0, listOf("agent", "x")), true, "", 0)
	expect(t, "second beyond the slots shares the first's bucket", e.Decide(t0, listOf("agent", "y")), false, ReasonResourceListsLimited, 10*s)
	// 10s on every bucket is full again: y takes a slot of its own.
	expect(t, "y in a freed slot", e.Decide(t0.Add(10*s), listOf("agent", "y")), true, "", 0)
	expect(t, "x in another", e.Decide(t0.Add(10*s), listOf("agent", "x")), true, "", 0)
	expect(t, "y again", e.Decide(t0.Add(10*s), listOf("agent", "y")), false, ReasonResourceListsLimited, 10*s)
}

// Without ListsPerMinutePerResource nothing is kept per resource.
func TestNoRebuildBucketsWithoutTheLimit(t *testing.T) {
	e := newTestEngine(t, Options{}, Budget{Name: "b", Limits: Limits{ListsPerMinute: 600, ListBurst: 100}})
	for i := range 50 {
		expect(t, fmt.Sprint("list ", i), e.Decide(t0, listOf("agent", "pods")), true, "", 0)
	}
	a := e.current.Load()
	bs := a.states[0]
	sh := bs.shards[0:]
	for i := range sh {
		sh[i].mu.Lock()
		sh[i].each(func(id *identity) {
			if id.resLists != nil {
				t.Errorf("%s keeps rebuild buckets without the limit", id.user)
			}
		})
		sh[i].mu.Unlock()
	}
}
