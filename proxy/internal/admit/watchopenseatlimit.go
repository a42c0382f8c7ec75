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
	// limit; any other round grows it. The slack keeps the jitter of
	// answers of a millisecond or two from counting as a slowdown.
	seatLatencyTolerance = 2
	seatLatencySlack     = 5 * time.Millisecond
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
// spare capacity stays near its floor, and rises as its queues grow. After
// each round (as many answers as the limit), the limit shrinks by
// seatShrink when the round's mean was over seatLatencyTolerance × the
// floor + seatLatencySlack, and grows by one otherwise, between
// minWatchOpenSeats and max; and it doubles after every seatRecovery
// without a slow round (recover). So when another caller's opens saturate
// the API server the opens in flight fall, and the fair queue in front of
// them gives every tenant its turn at the smaller number; once the API
// server keeps up again, within seconds, every tenant has the full number
// again.
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
// seatRecovery, as of now.
func (l *seatLimit) recover(now time.Time) {
	if l.limit >= float64(l.max) || now.Sub(l.changed) < seatRecovery {
		return
	}
	l.limit = min(float64(l.max), 2*l.limit)
	l.changed = now
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
	floor := l.floor
	if l.prevFloor != 0 && l.prevFloor < floor {
		floor = l.prevFloor
	}
	mean := l.roundSum / time.Duration(l.roundN)
	l.roundSum, l.roundN = 0, 0
	if mean > seatLatencyTolerance*floor+seatLatencySlack {
		l.limit = max(float64(min(minWatchOpenSeats, l.max)), l.limit*seatShrink)
		l.changed = now
	} else {
		l.limit = min(float64(l.max), l.limit+1)
	}
	watchOpenSeatsLimit.Set(float64(l.seats()))
}
