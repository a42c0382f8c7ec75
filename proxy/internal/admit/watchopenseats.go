package admit

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/proxy/internal/relay"
)

const (
	// DefaultMaxWatchOpensInFlight is the default of
	// --max-watch-opens-in-flight, the most seats: room for an agent's
	// restart (a watch open waits for the API server's response headers,
	// a few milliseconds on a healthy one, so 64 seats open thousands a
	// second), while one replica never asks an API server to start more
	// watches at once than a small share of its own concurrency
	// (kube-apiserver's --max-requests-inflight is 400). Fewer are in use
	// while the API server answers slowly (seatLimit).
	DefaultMaxWatchOpensInFlight = 64
	// maxWaitingPerTenant and maxWaiting bound the watch opens waiting for
	// a seat, per tenant and in all; beyond either a watch open gets 429
	// at once.
	maxWaitingPerTenant = 1024
	maxWaiting          = 16384
	// maxSeatWait is the longest a watch open waits for a seat before its
	// 429 (API Priority and Fairness waits a quarter of the request
	// timeout, 15 s by default).
	maxSeatWait = 15 * time.Second
	// seatRetryAfterSeconds is the Retry-After of a watch open refused a
	// seat.
	seatRetryAfterSeconds = 1
)

// GuardWatchOpenQueue: the watch open waited maxSeatWait for a seat among
// the watch opens in flight upstream, or its tenant already had
// maxWaitingPerTenant waiting; answered 429 with Retry-After.
const GuardWatchOpenQueue = "WatchOpenQueue"

// watchOpenSeats bounds the watch opens in flight upstream (sent, their
// response headers not yet back; for a watch asking for initial state, that
// state not yet passed: relay's HoldSeatUntilInitialized) and queues the
// rest fairly, as API
// Priority and Fairness queues requests for its seats: a free seat goes to
// the next tenant with a waiting open, round robin, and within that
// tenant to its next flow (caller and impersonated user), round robin;
// each flow's opens in the order they came; one tenant holds at most half
// the seats (tenantSeats). So however many watches one
// tenant opens at once, another tenant's open waits for at most one of its
// in each round, and the users behind one agent take turns too. How many
// are in flight at once follows how fast the API server answers them
// (seatLimit), at most seats: when one tenant's opens saturate the API
// server the limit falls, and every tenant gets its turn at the smaller
// number. A waiting open holds nothing shared (no guard place, no seat),
// only its request; it waits at most maxSeatWait, and at most maxWaitingPerTenant wait per
// tenant, maxWaiting in all; beyond, 429 with Retry-After.
//
// It is safe for concurrent use; each acquire and release is one lock and
// O(1) map work, plus the tenants waiting when one stops waiting.
type watchOpenSeats struct {
	seats int // the most in flight (the flag)
	clock clock.Clock

	limit *seatLimit // the in flight allowed now; guarded by mu

	mu       sync.Mutex
	inUse    int                    // guarded by mu
	held     map[string]int         // seats in flight by tenant, those with any; guarded by mu
	awaiting awaitLine              // the seats whose opens await their headers; guarded by mu
	waiting  int                    // guarded by mu
	tenants  map[string]*seatTenant // tenants with opens waiting; guarded by mu
	ring     []string               // those tenants, in turn order; guarded by mu
	next     int                    // the index in ring whose turn is next; guarded by mu
}

// awaitLine is the seats whose opens await their response headers, in
// the order given, linked through the seats.
type awaitLine struct{ oldest, newest *openSeat }

// seatTenant is one tenant's waiting opens, per flow.
type seatTenant struct {
	flows   map[seatFlow][]*seatWaiter
	ring    []seatFlow
	next    int
	waiting int
}

// seatFlow is a flow within a tenant: a caller, and the user it
// impersonates ("": none). Its strings are the request's own, not copies.
type seatFlow struct{ caller, user string }

// seatWaiter is one waiting open; ready is closed when it is given a seat.
type seatWaiter struct {
	ready chan struct{}
	seat  *openSeat // the seat given; guarded by watchOpenSeats.mu
}

// NewWatchOpenSeats returns the bound of at most seats watch opens in
// flight, or nil (no bound) for 0.
func NewWatchOpenSeats(seats int, clk clock.Clock) *watchOpenSeats {
	if seats <= 0 {
		return nil
	}
	return &watchOpenSeats{seats: seats, clock: clk, limit: newSeatLimit(seats), tenants: map[string]*seatTenant{}, held: map[string]int{}}
}

// acquire waits for a seat for a watch open of flow f; ok false when it
// was refused (queue full or waited too long) or the client left (ctx).
// After ok, call the seat's Answered once the open's response headers are
// back, and its Release once it no longer needs the seat (answered: both
// at once), or only Release when the open does not go upstream.
func (s *watchOpenSeats) acquire(ctx context.Context, f guard.Flow) (st *openSeat, ok bool) {
	s.mu.Lock()
	if s.inUse >= s.limit.seats() {
		s.adapt(s.clock.Now())
	}
	if s.inUse < s.limit.seats() && s.waiting == 0 && s.held[f.Tenant] < s.tenantSeats() {
		st = s.grant(f.Tenant)
		s.mu.Unlock()
		return st, true
	}
	t := s.tenants[f.Tenant]
	if s.waiting >= maxWaiting || t != nil && t.waiting >= maxWaitingPerTenant {
		s.mu.Unlock()
		return nil, false
	}
	if t == nil {
		t = &seatTenant{flows: map[seatFlow][]*seatWaiter{}}
		s.tenants[f.Tenant] = t
		s.ring = append(s.ring, f.Tenant)
	}
	key := seatFlow{f.Caller, f.User}
	if _, ok := t.flows[key]; !ok {
		t.ring = append(t.ring, key)
	}
	w := &seatWaiter{ready: make(chan struct{})}
	t.flows[key] = append(t.flows[key], w)
	t.waiting++
	s.waiting++
	s.dispatch()
	s.mu.Unlock()

	timer := s.clock.NewTimer(maxSeatWait)
	defer timer.Stop()
	select {
	case <-w.ready:
		return w.seat, true
	case <-timer.C():
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.seat != nil {
		// Given a seat as it stopped waiting: pass it on.
		s.takeBack(w.seat)
		s.dispatch()
		return nil, false
	}
	s.remove(f.Tenant, key, w)
	return nil, false
}

// A watch asking for initial state holds its seat through relay.
var _ relay.Seat = (*openSeat)(nil)

// openSeat is one seat given to a watch open.
type openSeat struct {
	s          *watchOpenSeats
	tenant     string
	granted    time.Time
	once       sync.Once
	headers    bool      // its headers are back (or it was released); guarded by s.mu
	prev, next *openSeat // in the awaitLine while not answered; guarded by s.mu
}

// tenantSeats is the most seats one tenant may hold: half the limit, so
// that whatever one tenant's opens hold (a watch asking for initial state
// holds its seat while that state streams), another tenant's open finds a
// seat free or soon freed by its own. Needs mu.
func (s *watchOpenSeats) tenantSeats() int {
	return max(1, s.limit.seats()/2)
}

// grant gives tenant a seat now, the newest awaiting its headers. Needs
// mu.
func (s *watchOpenSeats) grant(tenant string) *openSeat {
	s.held[tenant]++
	line := &s.awaiting
	st := &openSeat{s: s, tenant: tenant, granted: s.clock.Now(), prev: line.newest}
	if line.newest != nil {
		line.newest.next = st
	} else {
		line.oldest = st
	}
	line.newest = st
	s.inUse++
	return st
}

// headersBack marks st answered and takes it out of the line of opens
// awaiting their headers. Needs mu.
func (s *watchOpenSeats) headersBack(st *openSeat) {
	if st.headers {
		return
	}
	st.headers = true
	line := &s.awaiting
	if st.prev != nil {
		st.prev.next = st.next
	} else {
		line.oldest = st.next
	}
	if st.next != nil {
		st.next.prev = st.prev
	} else {
		line.newest = st.prev
	}
	st.prev, st.next = nil, nil
}

// takeBack takes st out of the seats in flight. Needs mu.
func (s *watchOpenSeats) takeBack(st *openSeat) {
	s.headersBack(st)
	s.inUse--
	if n := s.held[st.tenant] - 1; n > 0 {
		s.held[st.tenant] = n
	} else {
		delete(s.held, st.tenant)
	}
}

// adapt lets the limit shrink for an overdue open awaiting its headers,
// or recover, as of now. Needs mu.
func (s *watchOpenSeats) adapt(now time.Time) {
	var oldest time.Time
	if s.awaiting.oldest != nil {
		oldest = s.awaiting.oldest.granted
	}
	s.limit.stalled(now, oldest)
	s.limit.recover(now, oldest)
}

// Answered tells the seat that the API server's response headers are
// back: the time since it was granted is an answer time, which adapts the
// limit (seatLimit). The open keeps its seat until Release. Calls after
// the first, or after Release, do nothing.
func (st *openSeat) Answered() {
	s := st.s
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.headers {
		return
	}
	s.headersBack(st)
	s.limit.observe(now, now.Sub(st.granted))
	s.adapt(now)
	s.dispatch()
}

// Release gives the seat back; without Answered before, the open's time
// adapts nothing (it did not go upstream, or no answer came). Calls after
// the first do nothing.
func (st *openSeat) Release() { st.give(false) }

// releaseAnswered gives the seat back once the API server answered the open:
// Answered and Release at once.
func (st *openSeat) releaseAnswered() { st.give(true) }

// give gives the seat back, after taking its time as an answer time when
// answered and Answered did not. Calls after the first do nothing.
func (st *openSeat) give(answered bool) {
	st.once.Do(func() {
		s := st.s
		now := s.clock.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		if answered && !st.headers {
			s.headersBack(st)
			s.limit.observe(now, now.Sub(st.granted))
		}
		s.takeBack(st)
		s.adapt(now)
		s.dispatch()
	})
}

// dispatch gives free seats to waiting opens, tenant by tenant, flow by
// flow, passing over the tenants that hold their most (tenantSeats). Needs
// mu.
func (s *watchOpenSeats) dispatch() {
	for passed := 0; s.inUse < s.limit.seats() && s.waiting > 0 && passed < len(s.ring); {
		if s.next >= len(s.ring) {
			s.next = 0
		}
		name := s.ring[s.next]
		if s.held[name] >= s.tenantSeats() {
			s.next++
			passed++
			continue
		}
		passed = 0
		t := s.tenants[name]
		if t.next >= len(t.ring) {
			t.next = 0
		}
		key := t.ring[t.next]
		w := t.flows[key][0]
		w.seat = s.grant(name)
		close(w.ready)
		t.next++
		s.next++
		s.remove(name, key, w)
	}
}

// remove takes w out of its tenant's flow key, and the flow and tenant out
// of their rings when they have nothing left waiting. Needs mu.
func (s *watchOpenSeats) remove(tenant string, key seatFlow, w *seatWaiter) {
	t := s.tenants[tenant]
	q := t.flows[key]
	i := slices.Index(q, w)
	if i < 0 {
		return
	}
	q = slices.Delete(q, i, i+1)
	t.waiting--
	s.waiting--
	if len(q) > 0 {
		t.flows[key] = q
		return
	}
	delete(t.flows, key)
	if j := slices.Index(t.ring, key); j >= 0 {
		t.ring = slices.Delete(t.ring, j, j+1)
		if j < t.next {
			t.next--
		}
	}
	if t.waiting > 0 {
		return
	}
	delete(s.tenants, tenant)
	if j := slices.Index(s.ring, tenant); j >= 0 {
		s.ring = slices.Delete(s.ring, j, j+1)
		if j < s.next {
			s.next--
		}
	}
}

// text names the bound's flag and value, for a refusal's Warning.
func (s *watchOpenSeats) text() string {
	return fmt.Sprintf("watch opens wait their turn among --max-watch-opens-in-flight=%d, at most %s", s.seats, maxSeatWait)
}

// Refuse answers a watch open refused a seat with 429 and Retry-After.
func (s *watchOpenSeats) Refuse(w http.ResponseWriter, r *http.Request) {
	guard.Rejections.WithLabelValues(GuardWatchOpenQueue).Inc()
	w.Header().Set(answer.DecisionHeader, answer.FormatDecision("reject", GuardWatchOpenQueue, "", seatRetryAfterSeconds))
	answer.WriteStatus(w, r, apierrors.NewTooManyRequests(fmt.Sprintf(
		"watchgate is opening as many watches upstream as it may and yours waited its turn too long, please try again in %ds",
		seatRetryAfterSeconds), seatRetryAfterSeconds))
}

// seatWriter gives back its watch open's seat when the response's headers
// are written: the API server has started the watch, or refused it.
type seatWriter struct {
	http.ResponseWriter
	answered func()
}

func (w seatWriter) WriteHeader(code int) {
	w.answered()
	w.ResponseWriter.WriteHeader(code)
}

func (w seatWriter) Write(b []byte) (int, error) {
	w.answered()
	return w.ResponseWriter.Write(b)
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w seatWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
