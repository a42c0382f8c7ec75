package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

// aggregatePolicy: agents, in their own name, carry an Aggregate of 3
// concurrent watches and 6 opens a minute (burst 4) for everything they
// open for others; the people they impersonate get 2 concurrent watches
// each, and fresh buckets each.
func aggregatePolicy(t *testing.T, enforcement Enforcement, agg Aggregate) *Policy {
	t.Helper()
	sa := Subject{Kind: ServiceAccount, Namespace: "agents", Name: "*"}
	p, err := NewPolicy([]Budget{
		{Name: "agents", Precedence: 10, Impersonation: DirectOnly, Subjects: []Subject{sa}, Enforcement: enforcement, Aggregate: agg},
		{Name: "people", Precedence: 20, Impersonation: ImpersonatedOnly,
			Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 10, MaxConcurrentWatches: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	agentA = "system:serviceaccount:agents:a"
	agentB = "system:serviceaccount:agents:b"
)

func impersonatedWatch(caller, user string) *Request {
	return &Request{User: user, Verb: VerbWatch, Resource: "pods", ResourceVersion: "7", Impersonated: true, Caller: caller}
}

// A caller that invents a new user name for every watch gets a fresh
// identity each time, but its Aggregate holds the sum: at 3 open it waits
// for one to end, and its opens refill at 6 a minute. Another caller is
// not affected, and a rejection by the impersonated identity's own budget
// takes nothing from the Aggregate.
func TestAggregateBoundsWhatACallerOpensForOthers(t *testing.T) {
	e := NewEngine(Options{Seed: 1})
	t0 := time.Unix(1000, 0)
	e.SetPolicy(t0, aggregatePolicy(t, Enforce, Aggregate{WatchOpensPerMinute: 6, WatchBurst: 4, MaxConcurrentWatches: 3}))
	at := func(k int) time.Time { return t0.Add(time.Duration(k) * time.Second) }

	var open []Watch
	steps := []struct {
		at     time.Time
		caller string
		user   string
		want   Reason
		budget string
	}{
		{at(0), agentA, "u-1", ReasonNone, "people"},
		{at(0), agentA, "u-2", ReasonNone, "people"},
		{at(0), agentA, "u-3", ReasonNone, "people"},
		{at(0), agentA, "u-4", ReasonAggregateLimited, "agents"}, // 3 open: the cap of the sum
		{at(0), agentB, "u-4", ReasonNone, "people"},             // another caller: its own Aggregate
		{at(0), agentB, "u-4", ReasonNone, "people"},
		// u-4 holds its own 2: its budget rejects, and agent B's Aggregate
		// keeps the token and the slot it would have taken.
		{at(0), agentB, "u-4", ReasonTooManyWatches, "people"},
		{at(0), agentB, "u-5", ReasonNone, "people"}, // B's third
	}
	for i, s := range steps {
		d := e.Decide(s.at, impersonatedWatch(s.caller, s.user))
		if d.Reason != s.want || d.Budget != s.budget || d.Allowed != (s.want == ReasonNone) {
			t.Fatalf("step %d (%s as %s): %+v, want reason %q budget %q", i, s.caller, s.user, d, s.want, s.budget)
		}
		if s.caller == agentA && d.Allowed {
			open = append(open, d.Watch)
		}
	}
	// A's first watch ends: a slot is free, and one token is left of 4.
	e.WatchEnded(at(1), open[0], time.Second, OutcomeClosed)
	if d := e.Decide(at(1), impersonatedWatch(agentA, "u-6")); !d.Allowed {
		t.Fatalf("after a slot freed: %+v, want allowed", d)
	}
	e.WatchEnded(at(1), open[1], time.Second, OutcomeClosed)
	e.WatchEnded(at(1), open[2], time.Second, OutcomeClosed)
	// Slots are free but the bucket is empty: 4 taken, 0.1 a second back.
	d := e.Decide(at(2), impersonatedWatch(agentA, "u-7"))
	if d.Reason != ReasonAggregateLimited || d.RetryAfter <= 0 || d.RetryAfter > 10*time.Second {
		t.Fatalf("with the aggregate bucket empty: %+v, want AggregateLimited with a retry-after within 10s", d)
	}
	if d := e.Decide(at(11), impersonatedWatch(agentA, "u-7")); !d.Allowed {
		t.Fatalf("10s later: %+v, want allowed", d)
	}
	// The caller's own watches are its own budget's business.
	if d := e.Decide(at(11), &Request{User: agentA, Verb: VerbWatch, Resource: "pods"}); !d.Allowed || d.Budget != "agents" {
		t.Errorf("agent A in its own name: %+v, want allowed by agents", d)
	}
	if got := e.Stats()["agents"].Decisions[ReasonAggregateLimited]; got != 2 {
		t.Errorf("agents counted %d AggregateLimited decisions, want 2", got)
	}
}

// 200 made-up names open no more than the Aggregate's cap; a budget edit
// keeps the open count and the tokens the caller has spent.
func TestAggregateIsNotMultipliedByMadeUpNamesAndSurvivesAnEdit(t *testing.T) {
	e := NewEngine(Options{Seed: 1})
	t0 := time.Unix(1000, 0)
	e.SetPolicy(t0, aggregatePolicy(t, Enforce, Aggregate{MaxConcurrentWatches: 5, WatchOpensPerMinute: 600, WatchBurst: 50}))
	admitted := 0
	for i := range 200 {
		if d := e.Decide(t0, impersonatedWatch(agentA, fmt.Sprintf("made-up-%d", i))); d.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("200 made-up names opened %d watches, want the aggregate's 5", admitted)
	}
	// Raise the cap to 6: one more, not six more.
	e.SetPolicy(t0, aggregatePolicy(t, Enforce, Aggregate{MaxConcurrentWatches: 6, WatchOpensPerMinute: 600, WatchBurst: 50}))
	admitted = 0
	for i := range 10 {
		if d := e.Decide(t0, impersonatedWatch(agentA, fmt.Sprintf("fresh-%d", i))); d.Allowed {
			admitted++
		}
	}
	if admitted != 1 {
		t.Errorf("after raising the cap by one: %d more, want 1", admitted)
	}
}

// In DryRun the Aggregate reports what it would reject and admits it.
func TestAggregateInDryRunReports(t *testing.T) {
	e := NewEngine(Options{Seed: 1})
	t0 := time.Unix(1000, 0)
	e.SetPolicy(t0, aggregatePolicy(t, DryRun, Aggregate{MaxConcurrentWatches: 1}))
	if d := e.Decide(t0, impersonatedWatch(agentA, "u-1")); !d.Allowed || d.Reason != ReasonNone {
		t.Fatalf("first: %+v, want a plain allow", d)
	}
	d := e.Decide(t0, impersonatedWatch(agentA, "u-2"))
	if !d.Allowed || !d.DryRun || d.Reason != ReasonAggregateLimited {
		t.Errorf("second, over the DryRun aggregate: %+v, want allowed, DryRun, AggregateLimited", d)
	}
}

func TestAggregateIsValidated(t *testing.T) {
	for name, agg := range map[string]Aggregate{
		"opens without a burst": {WatchOpensPerMinute: 5},
		"a negative cap":        {MaxConcurrentWatches: -1},
		"an absurd rate":        {WatchOpensPerMinute: maxRate + 1, WatchBurst: 1},
	} {
		if _, err := NewPolicy([]Budget{{Name: "b", Aggregate: agg}}); err == nil {
			t.Errorf("%s: NewPolicy accepted %+v", name, agg)
		}
	}
}
