package ratelimit

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// report is replica's demand: budget "b", alice using u of it.
func report(replica string, u float64) Report {
	r := Report{Replica: replica, Budgets: map[string]Demand{}}
	if u > 0 {
		r.Budgets["b"] = Demand{Identities: map[string]float64{"alice": u}}
	}
	return r
}

func sum(fs []float64) float64 {
	s := 0.0
	for _, f := range fs {
		s += f
	}
	return s
}

// TestAllocateTimeline follows one identity's fractions round by round, the
// leader's clock being the rounds themselves: each round's reports are the
// use each replica saw under the previous round's fractions, which every
// replica applied.
func TestAllocateTimeline(t *testing.T) {
	type round struct {
		// use of the whole budget per replica, in a, b, c order; a
		// negative use is a replica gone (no report).
		use []float64
		// want: the fractions, within 0.01; nil: only check the sum.
		want []float64
	}
	for name, rounds := range map[string][]round{
		"clients spread over three saturated replicas keep a third each": {
			{use: []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, want: []float64{0.333, 0.333, 0.333}},
			{use: []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, want: []float64{0.333, 0.333, 0.333}},
		},
		"clients that move to one replica get the whole budget there once the others shrank": {
			// b and c shrink first: until they have applied that, a
			// cannot grow into what they may still admit.
			{use: []float64{1.0 / 3, 0, 0}, want: []float64{0.333, 0, 0}},
			{use: []float64{1.0 / 3, 0, 0}, want: []float64{1, 0, 0}},
			{use: []float64{1, 0, 0}, want: []float64{1, 0, 0}},
			// Clients come back on b: its one watch and those refused
			// for the cap are use beyond its share, and it takes some in
			// proportion, once a shrank.
			{use: []float64{1, 0.1, 0}, want: []float64{0.909, 0, 0}},
			{use: []float64{1, 0.1, 0}, want: []float64{0.909, 0.091, 0}},
			{use: []float64{0.9, 0.2, 0}, want: []float64{0.818, 0.091, 0}},
			{use: []float64{0.8, 0.2, 0}, want: []float64{0.8, 0.182, 0}},
		},
		"light use leaves the rest evenly as headroom": {
			{use: []float64{0.07, 0.07, 0}, want: []float64{0.333, 0.333, 0.266}},
			{use: []float64{0.07, 0.07, 0}, want: []float64{0.366, 0.366, 0.266}},
		},
		"a replica gone returns its share to the others": {
			{use: []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, want: []float64{0.333, 0.333, 0.333}},
			{use: []float64{1.0 / 3, 1.0 / 3, -1}, want: []float64{0.5, 0.5}},
		},
		"use far beyond the budget is bounded": {
			{use: []float64{1e9, math.NaN(), 0}, want: []float64{0.333, 0, 0}},
			{use: []float64{1e9, math.NaN(), 0}, want: []float64{1, 0, 0}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var history []*Allocation
			for i, r := range rounds {
				var reports []Report
				for j, u := range r.use {
					if u >= 0 || math.IsNaN(u) {
						rep := report(string(rune('a'+j)), u)
						if len(history) > 0 {
							rep.Applied = history[len(history)-1].Generation
						}
						reports = append(reports, rep)
					}
				}
				next := Allocate(history, reports, 16)
				got := next.Budgets["b"]["alice"]
				if s := sum(got); s > 1+1e-9 {
					t.Fatalf("round %d: fractions %v sum to %v > 1", i, got, s)
				}
				if len(got) != len(r.want) {
					t.Fatalf("round %d: fractions %v, want %v", i, got, r.want)
				}
				for j := range got {
					if math.Abs(got[j]-r.want[j]) > 0.01 {
						t.Fatalf("round %d: fractions %v, want %v", i, got, r.want)
					}
				}
				if want := int64(i + 1); next.Generation != want {
					t.Fatalf("round %d: generation %d, want %d", i, next.Generation, want)
				}
				history = append(history, next)
			}
		})
	}
}

// TestAllocateWaitsForShrinksToApply: replicas read each allocation at
// their own pace, so at any moment each enforces one of those written
// since the one it last reported applied. Over random uses and random
// lags, what the replicas enforce of one identity never sums above its
// whole budget.
func TestAllocateWaitsForShrinksToApply(t *testing.T) {
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed, 4))
		replicas := []string{"a", "b", "c"}
		// enforced[i] is the allocation replica i enforces; nil before any
		// (an even split).
		enforced := make([]*Allocation, len(replicas))
		var history []*Allocation
		check := func(round int, when string) {
			for _, user := range []string{"p", "q"} {
				total := 0.0
				for i, r := range replicas {
					s := EqualShares(len(replicas))
					if enforced[i] != nil {
						s, _ = enforced[i].Shares(r)
					}
					total += s.of("b", user)
				}
				if total > 1+1e-9 {
					t.Fatalf("seed %d, round %d, %s: %s's fractions in force sum to %v", seed, round, when, user, total)
				}
			}
		}
		for round := range 2000 {
			reports := make([]Report, len(replicas))
			for i, r := range replicas {
				reports[i] = Report{Replica: r, Budgets: map[string]Demand{"b": {Identities: map[string]float64{}}}}
				if enforced[i] != nil {
					reports[i].Applied = enforced[i].Generation
				}
				for _, user := range []string{"p", "q"} {
					if rng.IntN(3) > 0 {
						reports[i].Budgets["b"].Identities[user] = rng.Float64() * 1.5
					}
				}
			}
			next := Allocate(history, reports, 4)
			history = append(history, next)
			if len(history) > 8 {
				history = history[1:]
			}
			check(round, "written")
			// Each replica reads the newest with probability 1/2: the
			// others keep what they enforce, for rounds maybe.
			for i := range replicas {
				if rng.IntN(2) == 0 {
					enforced[i] = next
					check(round, "applied")
				}
			}
		}
	}
}

// TestAllocateDistrustsAGenerationNeverWritten: a replica that reports
// having applied an allocation the leader never wrote (its Lease edited by
// hand) may enforce anything: nobody grows into its share.
func TestAllocateDistrustsAGenerationNeverWritten(t *testing.T) {
	prev := &Allocation{Generation: 5, Replicas: []string{"a", "b"}, Budgets: map[string]map[string][]float64{"b": {"alice": {0.5, 0.5}}}}
	reports := []Report{report("a", 1), report("b", 0.01)}
	reports[0].Applied, reports[1].Applied = 5, 1<<40
	got := Allocate([]*Allocation{prev}, reports, 16).Budgets["b"]["alice"]
	if got[0] > 0.5+1e-9 {
		t.Fatalf("fractions %v: a grew while b claims generation %d", got, int64(1)<<40)
	}
}

// TestAllocateOneReplicaIsWhole: a replica alone enforces every budget
// whole, whatever its use, as without shares.
func TestAllocateOneReplicaIsWhole(t *testing.T) {
	var prev *Allocation
	for _, u := range []float64{0.07, 0.3, 1, 0.5, 0.0001} {
		prev = Allocate([]*Allocation{prev}, []Report{report("a", u)}, 16)
		if got := prev.Budgets["b"]["alice"]; len(got) != 1 || got[0] != 1 {
			t.Fatalf("use %v: fractions %v, want exactly [1]", u, got)
		}
		s, _ := prev.Shares("a")
		if got := scaleCount(30, s.of("b", "alice")); got != 30 {
			t.Fatalf("use %v: cap %d, want 30", u, got)
		}
	}
}

func TestAllocateBoundsIdentities(t *testing.T) {
	r := Report{Replica: "a", Budgets: map[string]Demand{"b": {Identities: map[string]float64{
		"u1": 0.1, "u2": 0.9, "u3": 0.5, "u4": 0.2,
	}}}}
	a := Allocate(nil, []Report{r, {Replica: "b"}}, 2)
	if got := len(a.Budgets["b"]); got != 2 {
		t.Fatalf("%d identities with a share of their own, want 2: %v", got, a.Budgets["b"])
	}
	for _, u := range []string{"u2", "u3"} {
		if _, ok := a.Budgets["b"][u]; !ok {
			t.Errorf("%s, of the highest demand, has no share of its own: %v", u, a.Budgets["b"])
		}
	}
	s, ok := a.Shares("b")
	if !ok {
		t.Fatal("replica b not in the allocation")
	}
	if got := s.of("b", "u1"); got != 0.5 {
		t.Errorf("u1's fraction on b: %v, want the even 0.5", got)
	}
	if got := s.of("other", "anyone"); got != 0.5 {
		t.Errorf("a budget nobody used: fraction %v, want the even 0.5", got)
	}
	if got := s.of("b", "u2"); got >= 0.5 {
		t.Errorf("u2, used only on a, keeps %v on b", got)
	}
	if s, ok := a.Shares("new"); ok || s.of("b", "u2") != 1.0/3 {
		t.Errorf("a replica the allocation does not name: %v (named %v), want a third", s.of("b", "u2"), ok)
	}
}

// TestAllocateNeverAboveWhole: whatever the reports and the previous
// allocation, no identity's fractions sum above 1.
func TestAllocateNeverAboveWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var prev *Allocation
	for round := range 500 {
		var reports []Report
		for j := range 1 + rng.IntN(5) {
			r := Report{Replica: string(rune('a' + rng.IntN(6))), Budgets: map[string]Demand{"b": {Identities: map[string]float64{}}}}
			for u := range 4 {
				if rng.IntN(3) > 0 {
					r.Budgets["b"].Identities[string(rune('p'+u))] = rng.Float64() * 2
				}
			}
			_ = j
			reports = append(reports, r)
		}
		next := Allocate([]*Allocation{prev}, reports, 3)
		for user, fs := range next.Budgets["b"] {
			if len(fs) != len(next.Replicas) {
				t.Fatalf("round %d: %s has %d fractions for %d replicas", round, user, len(fs), len(next.Replicas))
			}
			if s := sum(fs); s > 1+1e-9 {
				t.Fatalf("round %d: %s's fractions %v sum to %v", round, user, fs, s)
			}
		}
		prev = next
	}
}

// TestEngineShares is a timeline of one identity under a budget of 30
// concurrent watches and 60 opens a minute (burst 30) while its share
// changes.
func TestEngineShares(t *testing.T) {
	e := NewEngine(Options{Seed: 1})
	e.SetPolicy(t0, mustPolicy(t, Budget{Name: "b", Limits: Limits{MaxConcurrentWatches: 30, WatchOpensPerMinute: 60, WatchBurst: 30}}))
	open := func(at time.Time, n int) (admitted int, last Decision) {
		for range n {
			last = e.Decide(at, watch())
			if last.Allowed {
				admitted++
			}
		}
		return admitted, last
	}

	// t0: a third of the budget: 10 watches, the 11th refused for the cap.
	e.SetShares(t0, EqualShares(3))
	if d := e.Demand(t0, 10); len(d) != 0 {
		t.Fatalf("demand before any request: %v", d)
	}
	if got, last := open(t0, 11); got != 10 || last.Reason != ReasonTooManyWatches {
		t.Fatalf("a third of 30: admitted %d, last %v; want 10, %v", got, last.Reason, ReasonTooManyWatches)
	}
	d := e.Demand(t0.Add(2*time.Second), 10)
	// 10 open + 1 refused for the cap, of 30; opens 11 over 2 s at 60/min: 5.5.
	if got := d["b"].Identities["alice"]; math.Abs(got-5.5) > 1e-9 {
		t.Errorf("demand %v, want 5.5 (its asks, in 2 s, against the whole rate)", got)
	}
	// t1: its own share, the whole: the cap is 30 again; the tokens it
	// kept (a burst of 10 taken, refilled at a third of 60/min for 6 s: 2)
	// bound the opens.
	t1 := t0.Add(6 * time.Second)
	e.SetShares(t1, &Shares{Others: 1.0 / 3, Budgets: map[string]BudgetShares{"b": {Default: 1.0 / 3, Identities: map[string]float64{"alice": 1}}}})
	if got, last := open(t1, 3); got != 2 || last.Reason != ReasonRateLimited {
		t.Fatalf("after the share grew: admitted %d, last %v; want 2 (the tokens refilled), %v", got, last.Reason, ReasonRateLimited)
	}
	// t2 (30 s on): 30 tokens back, 18 slots left under the cap of 30.
	t2 := t1.Add(30 * time.Second)
	if got, last := open(t2, 20); got != 18 || last.Reason != ReasonTooManyWatches {
		t.Fatalf("whole budget: admitted %d, last %v; want 18 (to the cap of 30), %v", got, last.Reason, ReasonTooManyWatches)
	}
	// t3: back to a tenth: 30 open stay open, none more.
	t3 := t2.Add(time.Second)
	e.SetShares(t3, &Shares{Others: 0.1})
	if got, _ := open(t3, 1); got != 0 {
		t.Fatalf("a tenth with 30 open: admitted %d, want 0", got)
	}
	if open := e.Stats()["b"].ActiveWatches; open != 30 {
		t.Errorf("open watches %d after the share shrank, want 30 still open", open)
	}
	// nil: whole again.
	e.SetShares(t3, nil)
	if e.Shares() != nil {
		t.Error("Shares() after SetShares(nil) is not nil")
	}
}

// TestEngineSharesNeverZero: a share too small for one watch still admits
// one (the rounding the Shares doc bounds), and never more than the whole.
func TestEngineSharesNeverZero(t *testing.T) {
	for f, want := range map[float64]int{0: 1, 0.001: 1, 0.5: 2, 1: 4, 7: 4, math.NaN(): 1} {
		e := NewEngine(Options{Seed: 1})
		e.SetPolicy(t0, mustPolicy(t, Budget{Name: "b", Limits: Limits{MaxConcurrentWatches: 4}}))
		e.SetShares(t0, &Shares{Others: f})
		got := 0
		for range 10 {
			if e.Decide(t0, watch()).Allowed {
				got++
			}
		}
		if got != want {
			t.Errorf("fraction %v of 4: admitted %d, want %d", f, got, want)
		}
	}
}

// TestAllocateKeepsWhatReplicasHold: a replica's open watches stay open,
// so the fraction they hold stays its own, and another replica's growth
// comes only out of what is left.
func TestAllocateKeepsWhatReplicasHold(t *testing.T) {
	prev := &Allocation{Replicas: []string{"a", "b"}, Budgets: map[string]map[string][]float64{"b": {"alice": {0.6, 0.2}}}}
	reports := []Report{
		{Replica: "a", Budgets: map[string]Demand{"b": {Identities: map[string]float64{"alice": 0.6}, Held: map[string]float64{"alice": 0.6}}}},
		// b holds its 0.2 and was refused as many again, and more.
		{Replica: "b", Budgets: map[string]Demand{"b": {Identities: map[string]float64{"alice": 1}, Held: map[string]float64{"alice": 0.2}}}},
	}
	got := Allocate([]*Allocation{prev}, reports, 16).Budgets["b"]["alice"]
	// Without the held watches b would get 0.625 and a 0.375 while a holds
	// 0.6 open: 1.225 of the cap in all.
	if math.Abs(got[0]-0.6) > 1e-9 || math.Abs(got[1]-0.4) > 1e-9 {
		t.Fatalf("fractions %v, want [0.6 0.4]", got)
	}
	// Held beyond the whole (fractions that shrank under open watches):
	// each keeps its part, none may open more.
	reports[0].Budgets["b"].Held["alice"] = 0.9
	reports[1].Budgets["b"].Held["alice"] = 0.3
	got = Allocate([]*Allocation{prev}, reports, 16).Budgets["b"]["alice"]
	if math.Abs(got[0]-0.75) > 1e-9 || math.Abs(got[1]-0.25) > 1e-9 {
		t.Fatalf("fractions %v, want [0.75 0.25]", got)
	}
	// a, saturated, holds 0.55 of its 0.6 and may fill the rest before it
	// reads the allocation: b grows only into the 0.4 a leaves.
	reports[0].Budgets["b"].Identities["alice"] = 0.59
	reports[0].Budgets["b"].Held["alice"] = 0.55
	reports[1].Budgets["b"].Held["alice"] = 0.2
	got = Allocate([]*Allocation{prev}, reports, 16).Budgets["b"]["alice"]
	if math.Abs(got[0]-0.6) > 1e-9 || math.Abs(got[1]-0.4) > 1e-9 {
		t.Fatalf("fractions %v, want [0.6 0.4]", got)
	}
}
