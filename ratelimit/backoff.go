package ratelimit

import (
	"math"
	"time"
)

// backoffState is one watch key's backoff and stale-answer record.
type backoffState struct {
	// failures counts consecutive failures.
	failures int32
	// until is when the current delay expires, UnixNano; 0 when none.
	// Only watches opened at or after it add failures (see "A wave of
	// failures counts once").
	until int64
	// staleAt is the latest stale answer for the key, UnixNano; 0 when
	// none (see staleHold).
	staleAt int64
}

// Where an identity keeps backoff. Each identity tracks up to
// Options.MaxBackoffKeysPerIdentity watch keys of its own, and the engine
// up to Options.MaxBackoffKeys in all. A key that finds no room shares one
// of the identity's two overflow keys with every other such key:
//
//   - overflowKey holds the failures of forwarded watches (learn), and
//     governs every open of a key that is not tracked. So an identity
//     whose watches fail upstream on ever new keys stays throttled as one
//     key, however many keys it makes up;
//   - staleOverflowKey holds the stale answers given locally (staleHold),
//     and governs only how long the next such answer is held: a watch
//     answered locally costs the API server nothing, so ever new
//     made-up keys answered "too old" cannot back off the identity's
//     other watches (it is the same identity, but its token may have
//     leaked to a pod that loops on stale versions while the real
//     agent's informers must still open theirs).
//
// Neither it nor any other identity can take another identity's place:
// identities have a cap of their own (Options.MaxTrackedKeys). The overflow
// entries are not counted against MaxBackoffKeys: there are at most two per
// identity.

// isOverflow reports whether k is one of the overflow keys.
func isOverflow(k watchKey) bool { return k == overflowKey || k == staleOverflowKey }

// ownKeys is the number of the identity's tracked keys, overflow keys
// aside.
func (id *identity) ownKeys() int {
	n := len(id.backoff)
	for _, k := range [...]watchKey{overflowKey, staleOverflowKey} {
		if _, ok := id.backoff[k]; ok {
			n--
		}
	}
	return n
}

// lookup returns the key whose state governs an open of k, and that
// state: k's own when tracked, else the identity's overflowKey's when it
// has one.
func (id *identity) lookup(k watchKey) (watchKey, backoffState, bool) {
	return id.lookupIn(k, overflowKey)
}

// lookupIn is lookup with overflow as the key that governs untracked
// keys.
func (id *identity) lookupIn(k, overflow watchKey) (watchKey, backoffState, bool) {
	if st, ok := id.backoff[k]; ok {
		return k, st, true
	}
	if st, ok := id.backoff[overflow]; ok {
		return overflow, st, true
	}
	return k, backoffState{}, false
}

// slot returns where to record new state for k, and the state there: k's
// own entry when tracked or when both caps have room (then the key is
// counted, and the caller must store it), else overflow's. id.sh.mu is
// held.
func (e *Engine) slot(id *identity, k, overflow watchKey) (watchKey, backoffState) {
	if st, ok := id.backoff[k]; ok {
		return k, st
	}
	if id.ownKeys() < e.opts.MaxBackoffKeysPerIdentity && e.backoffKeys.take() {
		return k, backoffState{}
	}
	return overflow, id.backoff[overflow]
}

func (id *identity) put(k watchKey, st backoffState) {
	if id.backoff == nil {
		id.backoff = make(map[watchKey]backoffState, 1)
	}
	id.backoff[k] = st
}

// forget drops k's state. id.sh.mu is held.
func (e *Engine) forget(id *identity, k watchKey) {
	if _, ok := id.backoff[k]; !ok {
		return
	}
	delete(id.backoff, k)
	if !isOverflow(k) {
		e.backoffKeys.give(1)
	}
	if len(id.backoff) == 0 {
		id.backoff = nil
	}
}

// dropBackoff drops all of the identity's keys. id.sh.mu is held.
func (e *Engine) dropBackoff(id *identity) {
	e.backoffKeys.give(id.ownKeys())
	id.backoff = nil
}

// learn feeds the end of one watch with key req into the backoff of its
// key, following bo (a zero Initial disables backoff):
//
//   - a watch that lived at least ResetAfter clears the key, however it
//     ended (a long-lived watch that finally errors, typically with 410
//     after compaction, is healthy); with ResetAfter 0 every watch that is
//     not a failure clears it;
//   - otherwise a watch that ended with OutcomeError, or sooner than
//     ShortWatch, is a failure: the key's next watch waits backoffDelay
//     after now — if the watch was opened (now − lifetime) at or after
//     the key's delay ran out (see "A wave of failures counts once");
//   - otherwise, and after OutcomeDenied (the caller's rights are at
//     fault, not the watch), OutcomeNotForwarded or OutcomeThrottled (the
//     API server asked the client to come back later), nothing changes.
//
// The key is hashed only when something changes. id.sh.mu is held.
func (e *Engine) learn(id *identity, req *requestKey, now time.Time, lifetime time.Duration, outcome Outcome, bo Backoff) {
	if bo.Initial <= 0 || outcome == OutcomeDenied || outcome == OutcomeNotForwarded || outcome == OutcomeThrottled {
		return
	}
	failed := outcome == OutcomeError || lifetime < bo.ShortWatch
	if (bo.ResetAfter > 0 && lifetime >= bo.ResetAfter) || (bo.ResetAfter == 0 && !failed) {
		if len(id.backoff) > 0 {
			if k, _, ok := id.lookup(e.seeds.watchKeyOf(req)); ok {
				e.forget(id, k)
			}
		}
		return
	}
	if !failed {
		return
	}
	k, st := e.slot(id, e.seeds.watchKeyOf(req), overflowKey)
	if now.Add(-lifetime).UnixNano() < st.until {
		// Opened before the key's delay ran out: in flight when the key
		// last failed. A key slot returns new has no delay, so nothing
		// taken from the cap is left unstored here.
		return
	}
	id.put(k, e.failure(id, req, st, now, bo))
}

// A wave of failures counts once. A watch that fails adds a failure to
// its key only if it was opened at or after the key's current delay ran
// out (backoffState.until). Watches already open when the key last failed
// fail in the same event — an API server that restarts ends all of them;
// an agent that restarts opens thousands at once, and a hiccup of the API
// server fails hundreds — so their failures leave the key as it is,
// however late they are reported. A client that retries after a failure
// opens after the delay (it is refused until then), so a real loop still
// doubles the delay with every round. After a reset, or once Sweep has
// dropped the key, the next failure is a first one, whenever its watch
// opened.
//
// The end of the delay stands in for the instant of the failure that set
// it: in between, every open the key's state governs is refused, so a
// watch admitted under that state opened either before the failure or
// after the delay, and no instant is stored besides until. Two kinds of
// watches can still open in between, and do not count: a DryRun budget's,
// admitted while the key backs off, so that its delays follow what
// Enforce would have done rather than double with every round of a
// client's loop; and a watch whose own key was tracked when it opened, and
// dropped by a reset since, that fails into a backing-off overflow key.
//
// This holds for the overflow key alike, whose waves come from many keys
// at once. Stale answers (staleHold) count each: every one is a new
// request, answered at once and after the one before, so none is in
// flight when another is answered, and their growing holds are what slows
// a client that loops on a stale version.

// failure returns st after one more failure at now.
func (e *Engine) failure(id *identity, req *requestKey, st backoffState, now time.Time, bo Backoff) backoffState {
	if st.failures < math.MaxInt32 {
		st.failures++
	}
	ns := now.UnixNano()
	u := e.uniform(jitterInput(id.user, req), ns, st.failures)
	st.until = ns + int64(backoffDelay(bo, st.failures, e.jitter, u))
	return st
}

// staleHold records a watch answered locally as stale, and returns how
// long to hold the answer back. The answer is the API server's own (410
// Expired), but a client that comes back with a stale version at once is
// looping, exactly like one whose watches die within a second:
//
//   - the first stale answer for the identity's watch key is not held, so
//     a client that resyncs after "too old" is not slowed;
//   - a repeat within staleRepeatWindow of the previous one is held at
//     least StaleRepeatHold, whatever the budget's backoff — with Backoff
//     disabled, a looping client is answered about once a second;
//   - with Backoff enabled the answer also counts as a failed watch of the
//     key (see learn), and the hold is at least what is left of the key's
//     backoff before this failure: Initial, 2·Initial, … (callers cap
//     each hold).
//
// A key the identity cannot track keeps this in staleOverflowKey, which
// holds stale answers only: see "Where an identity keeps backoff".
//
// id.sh.mu is held.
func (e *Engine) staleHold(id *identity, req *requestKey, now time.Time, bo Backoff) time.Duration {
	k := e.seeds.watchKeyOf(req)
	ns := now.UnixNano()
	var hold time.Duration
	if _, prev, ok := id.lookupIn(k, staleOverflowKey); ok {
		hold = max(0, time.Duration(prev.until-ns))
		if prev.staleAt != 0 && ns-prev.staleAt < int64(staleRepeatWindow) {
			hold = max(hold, StaleRepeatHold)
		}
	}
	k, st := e.slot(id, k, staleOverflowKey)
	if bo.Initial > 0 {
		st = e.failure(id, req, st, now, bo)
	}
	st.staleAt = ns
	id.put(k, st)
	return hold
}

// backoffDelay is the delay after the n-th consecutive failure (n >= 1) of
// a watch key: the nominal delay doubles from Initial and is capped at Max,
//
//	d = min(Max, Initial·2^(n-1))
//
// and its last fraction jitter is drawn at random (u uniform in [0, 1)),
//
//	delay = max(Initial, d − jitter·u·d)
//
// so delays always stay within [Initial, Max], and clients that failed
// together do not come back together. With Initial 1s, Max 5m and no
// jitter: 1s, 2s, 4s, 8s, … 256s, 5m, 5m.
func backoffDelay(bo Backoff, n int32, jitter, u float64) time.Duration {
	d := bo.Initial
	for i := int32(1); i < n && d < bo.Max; i++ {
		d *= 2
	}
	d = min(d, bo.Max)
	return max(bo.Initial, d-time.Duration(jitter*u*float64(d)))
}

// uniform draws a number in [0, 1) from the engine's seed and the failure
// (a digest of user and key, instant and count), so that jitter is
// reproducible under a fixed Options.Seed yet differs between keys failing
// at the same instant. It needs no lock, unlike a shared random source.
func (e *Engine) uniform(digest uint64, ns int64, n int32) float64 {
	x := splitmix64(e.jitterSeed ^ digest ^ uint64(ns) ^ uint64(n)<<48)
	return float64(x>>11) / (1 << 53)
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
