package ratelimit

import (
	"hash/fnv"
	"math"
	"time"
)

// backoffState is one watch key's backoff.
type backoffState struct {
	// failures counts consecutive failures.
	failures int32
	// until is when the current delay expires, UnixNano.
	until int64
}

// learn feeds the end of one watch into the backoff of its key, following
// bo (a zero Initial disables backoff):
//
//   - a watch that lived at least ResetAfter clears the key, however it
//     ended (a long-lived watch that finally errors, typically with 410
//     after compaction, is healthy); with ResetAfter 0 every watch that is
//     not a failure clears it;
//   - otherwise a watch that ended with OutcomeError, or sooner than
//     ShortWatch, is a failure: the key's next watch waits backoffDelay
//     after now;
//   - otherwise nothing changes.
//
// Keys are not tracked beyond Options.MaxTrackedKeys. id.sh.mu is held.
func (e *Engine) learn(id *identity, key watchKey, now time.Time, lifetime time.Duration, outcome Outcome, bo Backoff) {
	if bo.Initial <= 0 || outcome == OutcomeDenied {
		return
	}
	sh := id.sh
	failed := outcome == OutcomeError || lifetime < bo.ShortWatch
	if (bo.ResetAfter > 0 && lifetime >= bo.ResetAfter) || (bo.ResetAfter == 0 && !failed) {
		if _, ok := id.backoff[key]; ok {
			delete(id.backoff, key)
			sh.keys--
			e.keys.Add(-1)
		}
		return
	}
	if !failed {
		return
	}
	st, ok := id.backoff[key]
	if !ok {
		if e.keys.Add(1) > int64(e.opts.MaxTrackedKeys) {
			e.keys.Add(-1)
			return
		}
		sh.keys++
		key = key.clone()
		if id.backoff == nil {
			id.backoff = make(map[watchKey]backoffState)
		}
	}
	if st.failures < math.MaxInt32 {
		st.failures++
	}
	ns := now.UnixNano()
	st.until = ns + int64(backoffDelay(bo, st.failures, e.jitter, e.uniform(id.user, key, ns, st.failures)))
	id.backoff[key] = st
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
// (user, key, instant and count), so that jitter is reproducible under a
// fixed Options.Seed yet differs between keys failing at the same instant.
// It needs no lock, unlike a shared random source.
func (e *Engine) uniform(user string, key watchKey, ns int64, n int32) float64 {
	h := fnv.New64a()
	for _, s := range [...]string{user, key.group, key.resource, key.namespace, key.labelSelector, key.fieldSelector} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	x := splitmix64(e.jitterSeed ^ h.Sum64() ^ uint64(ns) ^ uint64(n)<<48)
	return float64(x>>11) / (1 << 53)
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
