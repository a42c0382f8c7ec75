package relay

import (
	"cmp"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// InitSeatGap: kube-apiserver sends the events of a watch's initial
	// state back to back right behind the headers, so the state has passed
	// once the stream has been quiet this long. A watch without
	// sendInitialEvents has no other mark of its end; a watch-list's
	// bookmark that ends its initial events may come much later (an API
	// server without a watch cache waits for etcd's progress notification
	// to send it), while its cost was the events before.
	InitSeatGap = 5 * time.Millisecond
	// InitSeatMaxHold bounds how long a watch holds its seat for its
	// initial state: past it (a client that does not read, a huge
	// collection) the seat goes back without counting as an answer time.
	InitSeatMaxHold = 5 * time.Second
)

// Seat is a watch open's seat among the watch opens in flight upstream.
type Seat interface {
	// Answered: the API server's response headers are back.
	Answered()
	// Release gives the seat back, after Answered or without an answer.
	Release()
}

// initSeat is the seat among the watch opens in flight upstream that a
// watch asking for initial state holds until that state has passed, as API
// Priority and Fairness holds a watch's seat until the watch is
// initialized: what such a watch costs the API server (a list, its
// encoding) comes after the response headers.
type initSeat struct {
	seat     Seat
	gapAfter time.Duration
	once     sync.Once
	released atomic.Bool
	// events counts the events seen; the gap timer, each time it fires,
	// compares it with what it saw the time before (seen), so that an
	// event costs one atomic add, not a timer reset.
	events atomic.Uint64

	mu        sync.Mutex  // guards the timers against their own callbacks, and seen
	gap, hold *time.Timer // nil until the stream starts
	seen      uint64
}

// HoldSeatUntilInitialized makes the watch tell its seat when the API
// server's headers are back (Answered), and give it back (Release) only
// once its initial state has passed: after gap (0: InitSeatGap) to twice
// that without an event, or at a watch-list's bookmark that ends its
// initial events, whichever comes first; at most InitSeatMaxHold after its
// headers, and at once when the API server does not answer it with a
// stream this proxy reads. Call it before the watch is forwarded.
func (ws *Watch) HoldSeatUntilInitialized(seat Seat, gap time.Duration) {
	ws.seat = &initSeat{seat: seat, gapAfter: cmp.Or(gap, InitSeatGap)}
}

// seatAnswered tells the seat, if the watch holds one, that the API
// server's headers are back.
func (ws *Watch) seatAnswered() {
	if ws.seat != nil {
		ws.seat.seat.Answered()
	}
}

// releaseSeat gives the seat back, if the watch holds one.
func (ws *Watch) releaseSeat() {
	if ws.seat != nil {
		ws.seat.release()
	}
}

// startSeatTimers starts the seat's timers once the API server answered
// with a stream that is read: its headers are out.
func (ws *Watch) startSeatTimers() {
	s := ws.seat
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released.Load() {
		return
	}
	s.hold = time.AfterFunc(InitSeatMaxHold, s.release)
	s.gap = time.AfterFunc(s.gapAfter, s.gapEnded)
}

// sawEvent counts an event: the initial state is still coming.
func (s *initSeat) sawEvent() {
	if !s.released.Load() {
		s.events.Add(1)
	}
}

// gapEnded runs when the gap timer fires: the seat goes back if no event
// came since it last fired, else the timer waits another gap.
func (s *initSeat) gapEnded() {
	s.mu.Lock()
	if n := s.events.Load(); n != s.seen {
		s.seen = n
		if !s.released.Load() {
			s.gap.Reset(s.gapAfter)
		}
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.release()
}

// release gives the seat back, once.
func (s *initSeat) release() {
	s.once.Do(func() {
		s.released.Store(true)
		s.mu.Lock()
		if s.gap != nil {
			s.gap.Stop()
		}
		if s.hold != nil {
			s.hold.Stop()
		}
		s.mu.Unlock()
		s.seat.Release()
	})
}
