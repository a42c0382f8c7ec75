package ratelimit

import (
	"testing"
	"time"
)

// A watch the budget admitted but the replica's own guard then refused
// (the queue for a seat upstream was full, the memory mark) never reached
// the API server: ending it OutcomeNotForwarded gives back what the budget
// took for it — its watch tokens (InitialStateCost for a watch asking for
// initial state), its rebuild token, and its caller's Aggregate token — so
// that a client asking again after the replica's Retry-After is not then
// refused by its own budget for opens that never happened.
func TestNotForwardedWatchesGiveTheirTokensBack(t *testing.T) {
	p, err := NewPolicy([]Budget{
		{Name: "agents", Precedence: 10, Impersonation: DirectOnly,
			Subjects:  []Subject{{Kind: ServiceAccount, Namespace: "agents", Name: "*"}},
			Aggregate: Aggregate{WatchOpensPerMinute: 1, WatchBurst: 4}},
		{Name: "people", Precedence: 20,
			Limits: Limits{WatchOpensPerMinute: 1, WatchBurst: 4, InitialStateCost: 2, ListsPerMinutePerResource: 1, ListBurstPerResource: 2}},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(Options{Seed: 1})
	t0 := time.Unix(1000, 0)
	e.SetPolicy(t0, p)

	for name, req := range map[string]func() *Request{
		"from a version": func() *Request {
			return &Request{User: "alice", Verb: VerbWatch, Resource: "pods", ResourceVersion: "7"}
		},
		"asking for initial state": func() *Request { return &Request{User: "bob", Verb: VerbWatch, Resource: "pods"} },
		"impersonated, under an aggregate": func() *Request {
			return &Request{User: "carol", Verb: VerbWatch, Resource: "pods", ResourceVersion: "7", Impersonated: true, Caller: agentA}
		},
	} {
		t.Run(name, func(t *testing.T) {
			// Ten times the bucket, each admitted and then not forwarded,
			// all within a second (a refill takes a minute).
			for i := range 40 {
				d := e.Decide(t0, req())
				if !d.Allowed {
					t.Fatalf("open %d, after %d not forwarded: %+v, want allowed", i+1, i, d)
				}
				e.WatchEnded(t0, d.Watch, 0, OutcomeNotForwarded)
			}
			// Forwarded and ended, they are spent.
			refused := 0
			for range 5 {
				d := e.Decide(t0, req())
				if !d.Allowed {
					refused++
					continue
				}
				e.WatchEnded(t0, d.Watch, time.Millisecond, OutcomeClosed)
			}
			if refused == 0 {
				t.Errorf("5 opens that reached the API server within a second: none refused, want the buckets to run out")
			}
		})
	}
}
