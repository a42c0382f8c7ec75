package ratelimit_test

import (
	"fmt"
	"time"

	"github.com/watchgate/watchgate/ratelimit"
)

func Example() {
	policy, err := ratelimit.NewPolicy([]ratelimit.Budget{{
		Name:   "agents",
		Limits: ratelimit.Limits{WatchOpensPerMinute: 60, WatchBurst: 2, MaxConcurrentWatches: 10},
	}})
	if err != nil {
		panic(err)
	}
	engine := ratelimit.NewEngine(ratelimit.Options{})
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	engine.SetPolicy(start, policy)

	req := &ratelimit.Request{User: "agent", Verb: ratelimit.VerbWatch, Resource: "pods", ResourceVersion: "100"}
	for i := range 3 {
		d := engine.Decide(start, req)
		fmt.Printf("watch %d: allowed=%v reason=%q retry after %s\n", i, d.Allowed, d.Reason, d.RetryAfter)
		// ... proxy the watch; when it ends:
		engine.WatchEnded(start.Add(time.Minute), d.Watch, time.Minute, ratelimit.OutcomeClosed)
	}
	// Output:
	// watch 0: allowed=true reason="" retry after 0s
	// watch 1: allowed=true reason="" retry after 0s
	// watch 2: allowed=false reason="RateLimited" retry after 1s
}

// A DryRun budget observes what its identities do; Suggest turns the
// observation (merged over replicas, in watchgate's status) into limits.
func ExampleSuggest() {
	limits := ratelimit.Limits{WatchOpensPerMinute: 5, WatchBurst: 2, InitialStateCost: 1}
	policy, err := ratelimit.NewPolicy([]ratelimit.Budget{{Name: "everyone", Enforcement: ratelimit.DryRun, Limits: limits}})
	if err != nil {
		panic(err)
	}
	engine := ratelimit.NewEngine(ratelimit.Options{})
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	engine.SetPolicy(start, policy)

	// Nine users open 4 watches in a minute, one 40 in ten seconds.
	for u := range 10 {
		opens, every := 4, 15*time.Second
		if u == 9 {
			opens, every = 40, 250*time.Millisecond
		}
		for k := range opens {
			at := start.Add(time.Duration(k) * every)
			d := engine.Decide(at, &ratelimit.Request{User: fmt.Sprint("user-", u), Verb: ratelimit.VerbWatch, Resource: "pods", ResourceVersion: "100"})
			engine.WatchEnded(at.Add(time.Second), d.Watch, time.Second, ratelimit.OutcomeClosed)
		}
	}
	observed := engine.Stats()["everyone"].Observed
	s := ratelimit.Suggest(&observed, limits, ratelimit.Suggestion{Share: 90, HeadroomPercent: 150})
	fmt.Printf("%d/min, burst %d, %d at once; %d of %d identities refused\n",
		s.WatchOpensPerMinute, s.WatchBurst, s.MaxConcurrentWatches, s.WouldRefuse, s.Identities)
	// Output:
	// 6/min, burst 2, 2 at once; 1 of 10 identities refused
}
