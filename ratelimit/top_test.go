package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

func TestTopRanksIdentitiesByEachFigure(t *testing.T) {
	e := newTestEngine(t, Options{},
		Budget{Name: "dry", Precedence: 1, Enforcement: DryRun, Subjects: []Subject{{Kind: User, Name: "dreamer"}}, Limits: Limits{MaxConcurrentWatches: 1}},
		Budget{Name: "b", Precedence: 2, Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 3}},
	)
	req := func(user string) *Request { r := watch(); r.User = user; return r }
	var ended []Watch
	// greedy: 3 admitted, 4 rejected; holder: 2 admitted, both open;
	// quiet: 1 admitted, ended; dreamer (DryRun): 2 admitted, 1 would-be
	// rejection.
	for i := range 7 {
		e.Decide(t0.Add(time.Duration(i)*ms), req("greedy"))
	}
	e.Decide(t0, req("holder"))
	e.Decide(t0, req("holder"))
	ended = append(ended, e.Decide(t0, req("quiet")).Watch)
	e.Decide(t0, req("dreamer"))
	e.Decide(t0, req("dreamer"))
	for _, w := range ended {
		e.WatchEnded(t0.Add(s), w, s, OutcomeClosed)
	}

	for name, tc := range map[string]struct {
		budget string
		by     TopOrder
		n      int
		want   string
	}{
		"by rejections, identities without any left out": {"", ByRejections, 10,
			"map[b:[{greedy 4 3 3}] dry:[{dreamer 1 2 2}]]"},
		"by opens, ties by user": {"b", ByOpens, 10,
			"map[b:[{greedy 4 3 3} {holder 0 2 2} {quiet 0 1 0}]]"},
		"by open watches, the first n": {"b", ByWatches, 1,
			"map[b:[{greedy 4 3 3}]]"},
		"a budget the policy does not hold is absent": {"gone", ByOpens, 10,
			"map[]"},
		"n below 0 lists none": {"b", ByOpens, -1,
			"map[b:[]]"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := fmt.Sprint(e.Top(tc.budget, tc.by, tc.n)); got != tc.want {
				t.Errorf("Top(%q, %d, %d) = %s, want %s", tc.budget, tc.by, tc.n, got, tc.want)
			}
		})
	}
}

func TestTopReturnsAtMostMaxTop(t *testing.T) {
	e := newTestEngine(t, Options{}, Budget{Name: "b"})
	for i := range MaxTop + 20 {
		r := watch()
		r.User = fmt.Sprint("u", i)
		e.Decide(t0, r)
	}
	if got := len(e.Top("b", ByOpens, MaxTop+20)["b"]); got != MaxTop {
		t.Errorf("Top returned %d identities, want MaxTop (%d)", got, MaxTop)
	}
}
