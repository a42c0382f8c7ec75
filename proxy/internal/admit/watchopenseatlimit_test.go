package admit

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/proxy/internal/metricstest"
)

// rounds feeds l n rounds of answers of took each, one round after the
// other from *now, a round's opens in flight together, and returns the
// limit after each.
func rounds(l *seatLimit, now *time.Time, took time.Duration, n int) []int {
	var after []int
	for range n {
		*now = now.Add(took)
		for range l.seats() {
			l.observe(*now, took)
		}
		after = append(after, l.seats())
	}
	return after
}

// While the API server answers near its floor the limit stays at its
// most; when answers slow well past the floor it halves each round down
// to minWatchOpenSeats, and grows back by one a round once they are fast
// again.
func TestSeatLimitFollowsAnswerTime(t *testing.T) {
	now := time.Now()
	most := 4 * minWatchOpenSeats
	l := newSeatLimit(most)
	if got := rounds(l, &now, 5*time.Millisecond, 3); got[2] != most {
		t.Fatalf("fast answers: limit %v, want %d", got, most)
	}
	// A busy API server's few milliseconds more are within the slack.
	if got := rounds(l, &now, 5*time.Millisecond+seatLatencySlack, 2); got[1] != most {
		t.Fatalf("answers %v over the floor: limit %v, want %d", seatLatencySlack, got, most)
	}
	got := rounds(l, &now, 2*time.Second, 4)
	want := []int{2 * minWatchOpenSeats, minWatchOpenSeats, minWatchOpenSeats, minWatchOpenSeats}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("slow answers: limit after each round %v, want %v", got, want)
		}
	}
	got = rounds(l, &now, 6*time.Millisecond, 2)
	if got[0] != minWatchOpenSeats+1 || got[1] != minWatchOpenSeats+2 {
		t.Fatalf("fast answers again: limit after each round %v, want %d, %d", got, minWatchOpenSeats+1, minWatchOpenSeats+2)
	}
	// A slowdown within the tolerance keeps the limit growing.
	if got := rounds(l, &now, seatLatencyTolerance*5*time.Millisecond, 1); got[0] != minWatchOpenSeats+3 {
		t.Fatalf("answers at %d× the floor: limit %v, want %d", seatLatencyTolerance, got, minWatchOpenSeats+3)
	}
	if got := metricstest.GaugeValue(t, watchOpenSeatsLimit); got != float64(minWatchOpenSeats+3) {
		t.Errorf("watchgate_proxy_watch_open_seats = %v, want the limit %d", got, minWatchOpenSeats+3)
	}
}

// The floor is the fastest answer of the last two windows: once the API
// server answers slower for good (two windows), that is its new floor and
// the limit grows back.
func TestSeatLimitFloorFollowsALastingChange(t *testing.T) {
	now := time.Now()
	l := newSeatLimit(2 * minWatchOpenSeats)
	rounds(l, &now, time.Millisecond, 1)
	slow := 2 * time.Second
	if got := rounds(l, &now, slow, 3); got[2] != minWatchOpenSeats {
		t.Fatalf("slow answers: limit %v, want %d", got, minWatchOpenSeats)
	}
	for end := now.Add(2 * seatFloorWindow); now.Before(end); {
		rounds(l, &now, slow, 1)
	}
	if got := rounds(l, &now, slow, 2); got[1] <= minWatchOpenSeats {
		t.Fatalf("after two windows of answers at %v: limit %v, want it growing", slow, got)
	}
}

// A shrunk limit doubles after each seatRecovery without a shrink,
// whether or not opens came meanwhile, back to its most; a slow round
// restarts the wait.
func TestSeatLimitRecoversWithTime(t *testing.T) {
	now := time.Now()
	most := 4 * minWatchOpenSeats
	l := newSeatLimit(most)
	rounds(l, &now, time.Millisecond, 1)
	if got := rounds(l, &now, 2*time.Second, 3); got[2] != minWatchOpenSeats {
		t.Fatalf("slow answers: limit %v, want %d", got, minWatchOpenSeats)
	}
	l.recover(now.Add(seatRecovery/2), time.Time{})
	if got := l.seats(); got != minWatchOpenSeats {
		t.Fatalf("half a recovery after the slow round: limit %d, want %d", got, minWatchOpenSeats)
	}
	now = now.Add(seatRecovery)
	l.recover(now, time.Time{})
	if got := l.seats(); got != 2*minWatchOpenSeats {
		t.Fatalf("a recovery after the slow round: limit %d, want %d", got, 2*minWatchOpenSeats)
	}
	rounds(l, &now, 2*time.Second, 1)
	now = now.Add(seatRecovery / 2)
	l.recover(now, time.Time{})
	if got := l.seats(); got != minWatchOpenSeats {
		t.Fatalf("half a recovery after another slow round: limit %d, want %d", got, minWatchOpenSeats)
	}
	for range 10 {
		now = now.Add(seatRecovery)
		l.recover(now, time.Time{})
	}
	if got := l.seats(); got != most {
		t.Fatalf("ten recoveries later: limit %d, want its most %d", got, most)
	}
	if got := metricstest.GaugeValue(t, watchOpenSeatsLimit); got != float64(most) {
		t.Errorf("watchgate_proxy_watch_open_seats = %v, want %d", got, most)
	}
}

// Slow answers shrink the seats watch opens take: with fewer in flight
// than the flag allows, a further open waits its turn.
func TestWatchOpenSeatsShrinkWithSlowAnswers(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	s := NewWatchOpenSeats(2*minWatchOpenSeats, clk)
	// Two tenants take turns: one alone holds at most half the seats.
	alice, bob := guard.FlowOf("alice", ""), guard.FlowOf("bob", "")
	opened := 0
	open := func() *openSeat {
		t.Helper()
		f := alice
		if opened++; opened%2 == 0 {
			f = bob
		}
		st, ok := s.acquire(context.Background(), f)
		if !ok {
			t.Fatal("an open refused with a seat free")
		}
		return st
	}
	// A fast round sets the floor.
	for range 2 * minWatchOpenSeats {
		st := open()
		clk.Step(time.Millisecond)
		st.releaseAnswered()
	}
	var held []*openSeat
	for range 2 * minWatchOpenSeats {
		held = append(held, open())
	}
	clk.Step(time.Second)
	for _, st := range held {
		st.releaseAnswered()
	}
	if got := s.limit.seats(); got != minWatchOpenSeats {
		t.Fatalf("after a slow round the limit is %d, want %d", got, minWatchOpenSeats)
	}
	held = held[:0]
	for range minWatchOpenSeats {
		held = append(held, open())
	}
	got := make(chan bool)
	go func() {
		_, ok := s.acquire(context.Background(), alice)
		got <- ok
	}()
	waitQueued(t, s, 1)
	for _, st := range held {
		st.Release() // not answered: the opens did not go upstream
	}
	if !<-got {
		t.Fatal("the waiting open was refused when a seat came back")
	}
	if got := s.limit.seats(); got != minWatchOpenSeats {
		t.Fatalf("seats released without an answer changed the limit to %d", got)
	}
}

// An open in flight for longer than a slow answer takes shrinks the limit
// before any round completes, once per limit: a further shrink needs an
// open given under the shrunk limit to be overdue in turn. While an open
// is overdue the limit does not recover.
func TestSeatLimitShrinksForAnOverdueOpen(t *testing.T) {
	now := time.Now()
	most := 4 * minWatchOpenSeats
	l := newSeatLimit(most)
	rounds(l, &now, time.Millisecond, 1) // floor 1 ms: slow is over 502 ms
	first := now
	l.stalled(now.Add(400*time.Millisecond), first)
	if got := l.seats(); got != most {
		t.Fatalf("an open 400 ms awaiting its headers: limit %d, want %d", got, most)
	}
	now = now.Add(600 * time.Millisecond)
	l.stalled(now, first)
	if got := l.seats(); got != most/2 {
		t.Fatalf("an open 600 ms awaiting its headers: limit %d, want %d", got, most/2)
	}
	l.stalled(now.Add(600*time.Millisecond), first)
	if got := l.seats(); got != most/2 {
		t.Fatalf("the same open, given under the limit before: limit %d, want %d", got, most/2)
	}
	second := now.Add(time.Millisecond)
	now = now.Add(seatRecovery + time.Second)
	l.recover(now, second)
	if got := l.seats(); got != most/2 {
		t.Fatalf("a recovery later with an open overdue: limit %d, want %d", got, most/2)
	}
	l.stalled(now, second)
	if got := l.seats(); got != most/4 {
		t.Fatalf("an open given under the shrunk limit, overdue: limit %d, want %d", got, most/4)
	}
	now = now.Add(seatRecovery)
	l.recover(now, now.Add(-100*time.Millisecond))
	if got := l.seats(); got != most/2 {
		t.Fatalf("a recovery later, the oldest open awaiting its headers 100 ms: limit %d, want %d", got, most/2)
	}
}
