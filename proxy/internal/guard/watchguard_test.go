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
	if n := len(g.held); n != 1 {
		t.Errorf("%d callers tracked after bob and carol left, want 1", n)
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
