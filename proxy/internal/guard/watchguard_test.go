package guard

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestGuardVerdict(t *testing.T) {
	for name, tc := range map[string]struct {
		st               guardState
		max, perIdentity int64
		want             string
	}{
		"admits below every mark":                       {st: guardState{open: 10, callers: 3, held: 2}, max: 100},
		"refuses above the high-water mark":             {st: guardState{open: 10, highWater: true, nearMemory: true}, max: 100, want: GuardMemoryHighWater},
		"memory wins when both would refuse":            {st: guardState{open: 100, highWater: true}, max: 100, want: GuardMemoryHighWater},
		"refuses at the watch cap":                      {st: guardState{open: 100}, max: 100, want: GuardMaxWatches},
		"admits the last watch under the cap":           {st: guardState{open: 99}, max: 100},
		"no cap when max is 0":                          {st: guardState{open: 1 << 40}},
		"refuses a caller at its ceiling":               {st: guardState{open: 10, held: 25, callers: 1}, max: 100, perIdentity: 25, want: GuardMaxWatchesPerIdentity},
		"admits a caller under its ceiling":             {st: guardState{open: 10, held: 24, callers: 1}, max: 100, perIdentity: 25},
		"below 75% of the cap shares are not checked":   {st: guardState{open: 74, held: 70, callers: 2}, max: 100},
		"near the cap a caller at its share is refused": {st: guardState{open: 75, held: 50, callers: 2}, max: 100, want: GuardFairShare},
		// The newcomer counts: three callers share 100 watches.
		"near the cap a newcomer is admitted":         {st: guardState{open: 98, held: 0, callers: 2}, max: 100},
		"near the cap a caller under its share is in": {st: guardState{open: 90, held: 33, callers: 3}, max: 100},
		"near the cap a caller at a third is out":     {st: guardState{open: 90, held: 34, callers: 3}, max: 100, want: GuardFairShare},
		// Without a cap, near the memory mark the share is of what is open.
		"near the memory mark above the mean is out": {st: guardState{open: 90, held: 45, callers: 2, nearMemory: true}, want: GuardFairShare},
		"near the memory mark below the mean is in":  {st: guardState{open: 90, held: 44, callers: 2, nearMemory: true}},
		// A tenant's callers share its ceiling near it.
		"near its tenant's ceiling a caller at its share is out": {st: guardState{open: 20, held: 20, callers: 1, callerHeld: 13, tenantCallers: 2}, max: 100, perIdentity: 25, want: GuardFairShare},
		"near its tenant's ceiling a caller below it is in":      {st: guardState{open: 20, held: 20, callers: 1, callerHeld: 12, tenantCallers: 2}, max: 100, perIdentity: 25},
		// A caller's users: each at most a quarter, and their fair share
		// near the caller's ceiling.
		"a user at a quarter of its caller's ceiling is out":   {st: guardState{open: 10, held: 10, callers: 1, callerHeld: 10, tenantCallers: 1, impersonated: true, userHeld: 6, callerUsers: 1}, max: 100, perIdentity: 25, want: GuardMaxWatchesPerUser},
		"a user under a quarter of its caller's ceiling is in": {st: guardState{open: 10, held: 10, callers: 1, callerHeld: 10, tenantCallers: 1, impersonated: true, userHeld: 5, callerUsers: 1}, max: 100, perIdentity: 25},
		"near its caller's ceiling a user at its share is out": {st: guardState{open: 20, held: 20, callers: 1, callerHeld: 20, tenantCallers: 1, impersonated: true, userHeld: 5, callerUsers: 5}, max: 100, perIdentity: 25, want: GuardFairShare},
		"near its caller's ceiling a new user is in":           {st: guardState{open: 20, held: 20, callers: 1, callerHeld: 20, tenantCallers: 1, impersonated: true, userHeld: 0, callerUsers: 6}, max: 100, perIdentity: 25},
	} {
		t.Run(name, func(t *testing.T) {
			if got := guardVerdict(tc.st, tc.max, tc.perIdentity); got != tc.want {
				t.Errorf("guardVerdict = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestGuardCapsWatches(t *testing.T) {
	g := New(5, 0, 85, noMemory, clocktesting.NewFakePassiveClock(time.Now()))
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if r, _ := g.Admit(time.Now(), string(rune('a'+i%26))); r == "" {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 5 {
		t.Fatalf("%d of 50 concurrent watches admitted under a cap of 5", n)
	}
	if r, _ := g.Admit(time.Now(), "z"); r != GuardMaxWatches {
		t.Errorf("at the cap: %q, want %q", r, GuardMaxWatches)
	}
}

// Near the cap the replica's watches are shared max-min fairly among the
// callers holding them: one that holds its share or more waits, one below
// it gets in. Released places go back, and a caller's entry with them.
func TestGuardSharesFairlyNearTheCap(t *testing.T) {
	now := time.Now()
	g := New(8, 0, 85, noMemory, clocktesting.NewFakePassiveClock(now))
	steps := []struct {
		caller string
		want   string
	}{
		{"alice", ""}, {"alice", ""}, {"alice", ""}, {"alice", ""}, {"alice", ""},
		{"alice", ""}, // 6 of 8 open: near the cap from now on
		{"alice", ""}, // alone, alice's share is the whole replica
		{"bob", ""},   // 8 open: the cap
		{"bob", GuardMaxWatches},
	}
	for i, s := range steps {
		if got, _ := g.Admit(now, s.caller); got != s.want {
			t.Fatalf("step %d (%s): %q, want %q", i, s.caller, got, s.want)
		}
	}
	for range 3 {
		g.Release("alice")
	}
	// 5 open, alice 4, bob 1: below 75%; then near it, two callers share 8.
	if got, _ := g.Admit(now, "alice"); got != "" {
		t.Fatalf("alice below 75%%: %q, want admitted", got)
	}
	if got, _ := g.Admit(now, "alice"); got != GuardFairShare {
		t.Errorf("alice at 5 of 6 open, share 4: %q, want %q", got, GuardFairShare)
	}
	if got, _ := g.Admit(now, "carol"); got != "" {
		t.Errorf("carol, a newcomer near the cap: %q, want admitted", got)
	}
	if got, _ := g.Admit(now, "bob"); got != "" {
		t.Errorf("bob, 1 of a share of 3: %q, want admitted", got)
	}
	for range 2 {
		g.Release("bob")
	}
	g.Release("carol")
	if n := len(g.tenants); n != 1 {
		t.Errorf("%d callers tracked after bob and carol left, want 1", n)
	}
}

// Twelve service accounts of one namespace are one tenant: together they
// hold one caller's ceiling, and another tenant still gets in.
func TestGuardGroupsANamespacesServiceAccounts(t *testing.T) {
	now := time.Now()
	g := New(40, 10, 85, noMemory, clocktesting.NewFakePassiveClock(now))
	held := 0
	for i := range 12 {
		sa := "system:serviceaccount:swarm:sa-" + string(rune('a'+i))
		for range 4 {
			if r, _ := g.Admit(now, sa); r == "" {
				held++
			}
		}
	}
	if held != 10 {
		t.Errorf("the namespace's 12 accounts hold %d, want 10", held)
	}
	if r, _ := g.Admit(now, "system:serviceaccount:other:sa"); r != "" {
		t.Errorf("another namespace's account: %q, want admitted", r)
	}
	if r, _ := g.Admit(now, "alice"); r != "" {
		t.Errorf("a user: %q, want admitted", r)
	}
}

// One user behind an agent takes a quarter of the agent's ceiling, the
// next user gets in, and the agent as a whole still reaches its ceiling.
func TestGuardSharesAnAgentAmongItsUsers(t *testing.T) {
	now := time.Now()
	g := New(400, 100, 85, noMemory, clocktesting.NewFakePassiveClock(now))
	agent := "system:serviceaccount:agents:agent"
	admitted := func(user string, n int) int {
		held := 0
		for range n {
			if r, _ := g.AdmitFlow(now, FlowOf(agent, user)); r == "" {
				held++
			}
		}
		return held
	}
	if n := admitted("first", 100); n != 25 {
		t.Errorf("the first user holds %d, want 25 (a quarter of 100)", n)
	}
	if n := admitted("next", 1); n != 1 {
		t.Errorf("the next user's first watch: %d admitted, want 1", n)
	}
	total := 26
	for i := 0; total < 100; i++ {
		n := admitted(string(rune('a'+i)), 25)
		if n == 0 {
			break
		}
		total += n
	}
	if total != 100 {
		t.Errorf("the agent's users hold %d together, want its ceiling, 100", total)
	}
	// Near the agent's ceiling its users share it max-min: a place that
	// frees goes to the user below its share, not back to the first.
	g.ReleaseFlow(FlowOf(agent, "first"))
	if n := admitted("first", 1); n != 0 {
		t.Errorf("the first user (24, over a fifth of 100): %d admitted, want 0", n)
	}
	if n := admitted("next", 1); n != 1 {
		t.Errorf("the next user (1 of 100): %d admitted, want 1", n)
	}
}

func noMemory() (uint64, uint64) { return 0, 0 }

func TestGuardRefusalText(t *testing.T) {
	g := New(4000, 1000, 85, noMemory, clocktesting.NewFakePassiveClock(time.Now()))
	uncapped := New(0, 0, 90, noMemory, clocktesting.NewFakePassiveClock(time.Now()))
	for name, tc := range map[string]struct {
		g      *Guard
		reason string
		want   string
	}{
		"the replica's watch cap":  {g, GuardMaxWatches, "it forwards --max-watches=4000 watches"},
		"the cap per identity":     {g, GuardMaxWatchesPerIdentity, "you hold --max-watches-per-identity=1000 watches"},
		"the cap per user":         {g, GuardMaxWatchesPerUser, "the user you impersonate holds a quarter of --max-watches-per-identity=1000 watches"},
		"fair share near the cap":  {g, GuardFairShare, "near --max-watches=4000 or --memory-high-water-percent=85, you hold your fair share of the watches"},
		"fair share without a cap": {uncapped, GuardFairShare, "near --memory-high-water-percent=90, you hold your fair share of the watches"},
		"memory, sample not known": {g, GuardMemoryHighWater, "memory in use above --memory-high-water-percent=85"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := tc.g.RefusalText(tc.reason, nil); got != tc.want {
				t.Errorf("RefusalText = %q, want %q", got, tc.want)
			}
		})
	}
}
