package admit

import (
	"context"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/guard"
)

// waitQueued waits until n opens wait in s.
func waitQueued(t *testing.T, s *watchOpenSeats, n int) {
	t.Helper()
	for range 10000 {
		s.mu.Lock()
		waiting := s.waiting
		s.mu.Unlock()
		if waiting == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("never %d waiting", n)
}

// A free seat goes to the next tenant in turn, then to the next flow of
// that tenant: however many opens one tenant queued first, another
// tenant's open gets the second seat, and the users behind one agent take
// turns.
func TestWatchOpenSeatsAreSharedByTurns(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	s := NewWatchOpenSeats(1, clk)
	first, ok := s.acquire(context.Background(), guard.FlowOf("alice", ""))
	if !ok {
		t.Fatal("the first open waited with every seat free")
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	enqueue := func(f guard.Flow, name string, n int) {
		for range n {
			before := s.waiting
			wg.Go(func() {
				release, ok := s.acquire(context.Background(), f)
				if !ok {
					t.Errorf("%s refused", name)
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				release.Release()
			})
			waitQueued(t, s, before+1)
		}
	}
	agent := "system:serviceaccount:agents:agent"
	enqueue(guard.FlowOf("system:serviceaccount:swarm:a", ""), "swarm-a", 3)
	enqueue(guard.FlowOf("system:serviceaccount:swarm:b", ""), "swarm-b", 3)
	enqueue(guard.FlowOf(agent, "ann"), "ann", 2)
	enqueue(guard.FlowOf(agent, "bob"), "bob", 1)
	first.Release()
	wg.Wait()
	want := []string{"swarm-a", "ann", "swarm-b", "bob", "swarm-a", "ann", "swarm-b", "swarm-a", "swarm-b"}
	if len(order) != len(want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order %v, want %v", order, want)
		}
	}
}

// A waiting open stops waiting after maxSeatWait, or when its client
// leaves, and leaves nothing behind; its tenant's queue is bounded.
func TestWatchOpenSeatsWaitIsBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	s := NewWatchOpenSeats(1, clk)
	hold, _ := s.acquire(context.Background(), guard.FlowOf("alice", ""))
	done := make(chan bool)
	go func() {
		_, ok := s.acquire(context.Background(), guard.FlowOf("bob", ""))
		done <- ok
	}()
	waitQueued(t, s, 1)
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	clk.Step(maxSeatWait)
	if <-done {
		t.Fatal("an open that waited maxSeatWait got a seat")
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, ok := s.acquire(ctx, guard.FlowOf("carol", ""))
		done <- ok
	}()
	waitQueued(t, s, 1)
	cancel()
	if <-done {
		t.Fatal("an open whose client left got a seat")
	}
	if len(s.tenants) != 0 || len(s.ring) != 0 || s.waiting != 0 {
		t.Fatalf("left behind: %d tenants, ring %v, %d waiting", len(s.tenants), s.ring, s.waiting)
	}

	// A tenant's queue is full at maxWaitingPerTenant: the next is refused
	// at once.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range maxWaitingPerTenant {
		wg.Go(func() { s.acquire(ctx, guard.FlowOf("system:serviceaccount:swarm:x", "")) })
	}
	waitQueued(t, s, maxWaitingPerTenant)
	if _, ok := s.acquire(ctx, guard.FlowOf("system:serviceaccount:swarm:y", "")); ok {
		t.Error("an open beyond its tenant's full queue got a seat")
	}
	cancel()
	wg.Wait()
	hold.Release()
	if again, ok := s.acquire(context.Background(), guard.FlowOf("dave", "")); !ok {
		t.Error("no seat after every waiter left and the holder released")
	} else {
		again.Release()
	}
}

// One tenant holds at most half the seats, however many opens it queued
// first: another tenant's open gets a seat at once, and a seat the first
// gives back goes to its own next open.
func TestWatchOpenSeatsKeepHalfForOtherTenants(t *testing.T) {
	s := NewWatchOpenSeats(2*minWatchOpenSeats, clocktesting.NewFakeClock(time.Now()))
	swarm := guard.FlowOf("system:serviceaccount:swarm:a", "")
	var held []*openSeat
	for range minWatchOpenSeats {
		st, ok := s.acquire(context.Background(), swarm)
		if !ok {
			t.Fatal("an open refused below its tenant's half")
		}
		held = append(held, st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	more := make(chan *openSeat)
	go func() {
		st, _ := s.acquire(ctx, guard.FlowOf("system:serviceaccount:swarm:b", ""))
		more <- st
	}()
	waitQueued(t, s, 1)
	agent, ok := s.acquire(context.Background(), guard.FlowOf("system:serviceaccount:agents:agent", ""))
	if !ok {
		t.Fatal("another tenant's open waited with half the seats free")
	}
	agent.Release()
	held[0].Release()
	if st := <-more; st == nil {
		t.Fatal("the swarm's waiting open got no seat when one of its own came back")
	} else {
		st.Release()
	}
	for _, st := range held[1:] {
		st.Release()
	}
	if s.inUse != 0 || len(s.held) != 0 || s.awaiting != (awaitLine{}) {
		t.Fatalf("left behind: %d in use, held %v", s.inUse, s.held)
	}
}

// A seat whose open has its headers back is no longer awaiting an answer:
// a watch that holds it while its initial state streams is not overdue,
// however long that takes, and its Release adds no answer time. Only the
// time to the headers is one.
func TestWatchOpenSeatsTimeHeadersNotInitialState(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	most := 2 * minWatchOpenSeats
	s := NewWatchOpenSeats(most, clk)
	alice, bob := guard.FlowOf("alice", ""), guard.FlowOf("bob", "")
	for i := range most {
		f := alice
		if i%2 == 1 {
			f = bob
		}
		st, ok := s.acquire(context.Background(), f)
		if !ok {
			t.Fatal("an open refused with every seat free")
		}
		clk.Step(time.Millisecond)
		st.releaseAnswered()
	}
	list, ok := s.acquire(context.Background(), alice)
	if !ok {
		t.Fatal("a watch-list refused with every seat free")
	}
	clk.Step(time.Millisecond)
	list.Answered()
	clk.Step(time.Second) // its initial state streams
	s.mu.Lock()
	s.adapt(clk.Now())
	inUse, limit := s.inUse, s.limit.seats()
	s.mu.Unlock()
	if inUse != 1 || limit != most {
		t.Fatalf("a watch-list streaming its state for 1 s: %d in use, limit %d; want 1, %d", inUse, limit, most)
	}
	list.Release()
	if got := s.limit; got.roundN != 1 || got.roundSum != time.Millisecond {
		t.Fatalf("answer times since the round before: %d summing %v, want the watch-list's 1 of 1ms", got.roundN, got.roundSum)
	}
	// An open still awaiting its headers after as long is overdue.
	st, _ := s.acquire(context.Background(), bob)
	clk.Step(time.Second)
	s.mu.Lock()
	s.adapt(clk.Now())
	limit = s.limit.seats()
	s.mu.Unlock()
	if limit != most/2 {
		t.Fatalf("an open awaiting its headers for 1 s: limit %d, want %d", limit, most/2)
	}
	st.Release()
	if s.inUse != 0 || len(s.held) != 0 || s.awaiting != (awaitLine{}) {
		t.Fatalf("left behind: %d in use, held %v", s.inUse, s.held)
	}
}
