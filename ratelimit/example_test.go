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
