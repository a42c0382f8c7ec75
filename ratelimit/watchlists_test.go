package ratelimit

import (
	"testing"
	"time"
)

// watchListOf is a client-go watch-list of user's (group, resource).
func watchListOf(user, group, resource string) *Request {
	yes := true
	return &Request{User: user, Verb: VerbWatch, Group: group, Resource: resource,
		ResourceVersionMatch: "NotOlderThan", SendInitialEvents: &yes}
}

// resumeOf is the watch client-go opens from a version once synced.
func resumeOf(user, group, resource string) *Request {
	return &Request{User: user, Verb: VerbWatch, Group: group, Resource: resource, ResourceVersion: "7"}
}

func TestIncompleteWatchListsAreRefusedPerIdentityAndResource(t *testing.T) {
	e := newTestEngine(t, Options{}, Budget{Name: "b", Limits: Limits{WatchOpensPerMinute: 6000, WatchBurst: 1000}})
	// attempt decides a watch-list (or resume) at at and, when admitted,
	// ends it (complete or not) and reports the Decision.
	attempt := func(at time.Time, r *Request, complete bool) Decision {
		d := e.Decide(at, r)
		if d.Allowed && r.isWatchList() {
			e.WatchListEnded(at, d.Watch, complete)
		}
		e.WatchEnded(at, d.Watch, 100*ms, OutcomeClosed)
		return d
	}
	widgets := func() *Request { return watchListOf("alice", "loops.example", "widgets") }
	for i := range IncompleteWatchListLimit {
		expect(t, "forwarded while under the limit", attempt(t0.Add(time.Duration(i)*s), widgets(), false), true, "", 0)
	}
	t3 := t0.Add(2 * s)
	// The limit reached at t3: refused for the hold, counted from t3.
	expect(t, "refused at the limit", attempt(t0.Add(3*s), widgets(), false), false, ReasonWatchListIncomplete, IncompleteWatchListHold-s)
	// Another resource, another identity, and a list of the resource are
	// not refused.
	expect(t, "another resource", attempt(t0.Add(3*s), watchListOf("alice", "loops.example", "gadgets"), true), true, "", 0)
	expect(t, "another identity", attempt(t0.Add(3*s), watchListOf("bob", "loops.example", "widgets"), false), true, "", 0)
	expect(t, "a list", e.Decide(t0.Add(3*s), &Request{User: "alice", Verb: VerbList, Group: "loops.example", Resource: "widgets"}), true, "", 0)
	// A resume (the client listed and synced) does not lift the refusal.
	expect(t, "a resume", attempt(t0.Add(4*s), resumeOf("alice", "loops.example", "widgets"), false), true, "", 0)
	expect(t, "still refused", attempt(t0.Add(5*s), widgets(), false), false, ReasonWatchListIncomplete, IncompleteWatchListHold-3*s)
	// After the hold, IncompleteWatchListLimit more go through.
	t4 := t3.Add(IncompleteWatchListHold)
	for i := range IncompleteWatchListLimit {
		expect(t, "after the hold", attempt(t4.Add(time.Duration(i)*s), widgets(), false), true, "", 0)
	}
	expect(t, "refused again", attempt(t4.Add(3*s), widgets(), false), false, ReasonWatchListIncomplete, IncompleteWatchListHold-s)
	if got := e.Stats()["b"].Decisions[ReasonWatchListIncomplete]; got != 3 {
		t.Errorf("Decisions[%s] = %d, want 3", ReasonWatchListIncomplete, got)
	}
}

func TestCompleteWatchListsAndResumesStartTheCountAgain(t *testing.T) {
	e := newTestEngine(t, Options{}, Budget{Name: "b", Limits: Limits{WatchOpensPerMinute: 6000, WatchBurst: 1000}})
	at := t0
	step := func(r *Request, complete bool) Decision {
		at = at.Add(s)
		d := e.Decide(at, r)
		if d.Allowed && r.isWatchList() {
			e.WatchListEnded(at, d.Watch, complete)
		}
		e.WatchEnded(at, d.Watch, 100*ms, OutcomeClosed)
		return d
	}
	wl := func() *Request { return watchListOf("alice", "", "pods") }
	// Two misses, a complete watch-list, two misses, a resume, two misses:
	// never IncompleteWatchListLimit in a row.
	for _, complete := range []bool{false, false, true, false, false} {
		expect(t, "watch-list", step(wl(), complete), true, "", 0)
	}
	expect(t, "resume", step(resumeOf("alice", "", "pods"), false), true, "", 0)
	for range 2 {
		expect(t, "watch-list", step(wl(), false), true, "", 0)
	}
	expect(t, "the third in a row is the limit", step(wl(), false), true, "", 0)
	expect(t, "refused", step(wl(), false), false, ReasonWatchListIncomplete, IncompleteWatchListHold-s)
}

func TestIncompleteWatchListMemoryIsBoundedAndSwept(t *testing.T) {
	e := newTestEngine(t, Options{IdleAfter: time.Minute}, Budget{Name: "b"})
	miss := func(at time.Time, user, resource string) {
		d := e.Decide(at, watchListOf(user, "", resource))
		e.WatchListEnded(at, d.Watch, false)
		e.WatchEnded(at, d.Watch, 0, OutcomeClosed)
	}
	// One identity missing on more resources than it keeps: bounded.
	for i := range 3 * watchListResourcesPerIdentity {
		miss(t0, "alice", string(rune('a'+i)))
	}
	if got := e.watchLists.tracked.Load(); got != 1 {
		t.Fatalf("identities tracked = %d, want 1", got)
	}
	// Misses idle for IdleAfter are forgotten; a refusal lasts its hold.
	for range IncompleteWatchListLimit {
		miss(t0, "bob", "pods")
	}
	if n := e.Sweep(t0.Add(2 * time.Minute)); n < watchListResourcesPerIdentity {
		t.Errorf("Sweep evicted %d, want at least alice's %d resources", n, watchListResourcesPerIdentity)
	}
	expect(t, "refusal survives the sweep", e.Decide(t0.Add(2*time.Minute), watchListOf("bob", "", "pods")), false, ReasonWatchListIncomplete, IncompleteWatchListHold-2*time.Minute)
	e.Sweep(t0.Add(IncompleteWatchListHold + 2*time.Minute))
	if got := e.watchLists.tracked.Load(); got != 0 {
		t.Errorf("identities tracked after the hold and IdleAfter = %d, want 0", got)
	}
}
