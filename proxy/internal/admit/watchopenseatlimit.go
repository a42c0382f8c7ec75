package admit

import (
	"time"
)

const (
	// minWatchOpenSeats is the fewest seats the adaptive limit keeps,
	// however slow the API server answers: with two tenants opening at
	// once the fair queue gives each 8 in flight, so that an agent's
	// restart beside another tenant's storm opens its watches 8 at a time,
	// not one by one.
	minWatchOpenSeats = 16
	// seatLatencyTolerance and seatLatencySlack: a round of opens whose
	// mean answer time is over tolerance × the floor + slack shrinks the
	// limit; any other round grows it. The slack is what a burst costs an
	// API server that keeps up: it answers a burst's opens one after the
	// other, so the last waits for those before it. An agent's restart of
	// 70 watch-lists at once takes 80–100 ms straight to a one-core
	// kube-apiserver, 100–300 ms beside a hostile tenant's storm; an API
	// server in trouble answers in seconds (API Priority and Fairness
	// queues a request for up to 15 s). A smaller slack took every
	// restart's burst for a slowdown and left the agent 8 opens at a time.
	seatLatencyTolerance = 2
	seatLatencySlack     = 500 * time.Millisecond
	// seatShrink is the factor a slow round shrinks the limit by.
	seatShrink = 0.5
	// seatFloorWindow: the floor is the fastest answer of the current
	// and the previous window, so that it follows a lasting change of the
	// API server (a new version, a new node) within two windows.
	seatFloorWindow = 30 * time.Second
	// seatRecovery: a limit below its most that no slow round shrank for
	// this long doubles, so that a shrink outlives the slowdown that
	// caused it by at most a few seconds, also when few opens come to
	// show that the API server is fast again.
	seatRecovery = time.Second
)

// seatLimit is how many watch opens may be in flight upstream, adapted to
// how fast the API server answers them, as TCP Vegas adapts a window: the
// answer time (seat given → response headers back) of an API server with
// spare capacity stays near its floor, and rises as its queues grow. What
// a watch's initial state takes to stream after its headers is no answer
// time: it grows with the collection, not with the API server's queues.
// After each round (as many answers as the limit), the limit shrinks by
// seatShrink when the round's mean was over seatLatencyTolerance × the
// floor + seatLatencySlack, and grows by one otherwise, between
// minWatchOpenSeats and max. It also shrinks, once per limit, as soon as
// the oldest open awaiting its headers has waited longer than a slow
// answer takes (stalled): an API server that stops answering shows it
// before a round completes. It doubles after every seatRecovery without a
// shrink while no open is overdue (recover). So when another caller's
// opens overload the API server the opens in flight fall, and the fair
// queue in front of them gives every tenant its turn at the smaller
// number; once the API server keeps up again, within seconds, every
// tenant has the full number again.
//
// Not safe for concurrent use: watchOpenSeats.mu guards it.
type seatLimit struct {
	max   int
	limit float64

	floor, prevFloor time.Duration // fastest answer this window and the previous; 0: none
	windowStart      time.Time

	roundSum time.Duration
	roundN   int

	changed time.Time // when a slow round or recover last changed the limit
}

func newSeatLimit(max int) *seatLimit {
	watchOpenSeatsLimit.Set(float64(max))
	return &seatLimit{max: max, limit: float64(max)}
}

// seats is the current limit.
func (l *seatLimit) seats() int { return int(l.limit) }

// recover doubles a limit below its most that nothing changed for
// seatRecovery, as of now, unless the oldest open awaiting its headers
// (granted then; zero: none) has been waiting longer than a slow answer
// takes: answers that do not come are no sign of a fast API server.
func (l *seatLimit) recover(now, oldest time.Time) {
	if l.limit >= float64(l.max) || now.Sub(l.changed) < seatRecovery || l.overdue(now, oldest) {
		return
	}
	l.limit = min(float64(l.max), 2*l.limit)
	l.changed = now
	watchOpenSeatsLimit.Set(float64(l.seats()))
}

// stalled shrinks the limit when the oldest open awaiting its headers
// (granted then; zero: none) has been waiting longer than a slow answer
// takes and was granted under the current limit: an API server that
// stopped answering shows it before a round of answers can, and each
// limit gets one such shrink, as a TCP window is cut once per round trip.
func (l *seatLimit) stalled(now, oldest time.Time) {
	if oldest.Before(l.changed) || !l.overdue(now, oldest) {
		return
	}
	l.shrink(now)
}

// overdue reports whether an open granted at oldest (zero: none) and not
// answered by now took longer than a slow answer.
func (l *seatLimit) overdue(now, oldest time.Time) bool {
	floor := l.lowestFloor()
	return !oldest.IsZero() && floor != 0 && now.Sub(oldest) > seatLatencyTolerance*floor+seatLatencySlack
}

// lowestFloor is the fastest answer of this window and the previous; 0:
// none yet.
func (l *seatLimit) lowestFloor() time.Duration {
	if l.prevFloor != 0 && (l.floor == 0 || l.prevFloor < l.floor) {
		return l.prevFloor
	}
	return l.floor
}

// shrink cuts the limit by seatShrink, to no fewer than minWatchOpenSeats,
// and starts a new round.
func (l *seatLimit) shrink(now time.Time) {
	l.limit = max(float64(min(minWatchOpenSeats, l.max)), l.limit*seatShrink)
	l.changed = now
	l.roundSum, l.roundN = 0, 0
	watchOpenSeatsLimit.Set(float64(l.seats()))
}

// observe takes one open's answer time took, seen at now.
func (l *seatLimit) observe(now time.Time, took time.Duration) {
	if l.windowStart.IsZero() || now.Sub(l.windowStart) >= seatFloorWindow {
		l.prevFloor, l.floor, l.windowStart = l.floor, 0, now
	}
	if l.floor == 0 || took < l.floor {
		l.floor = took
	}
	l.roundSum += took
	l.roundN++
	if l.roundN < l.seats() {
		return
	}
	mean := l.roundSum / time.Duration(l.roundN)
	l.roundSum, l.roundN = 0, 0
	if mean > seatLatencyTolerance*l.lowestFloor()+seatLatencySlack {
		l.shrink(now)
		return
	}
	l.limit = min(float64(l.max), l.limit+1)
	watchOpenSeatsLimit.Set(float64(l.seats()))
}
