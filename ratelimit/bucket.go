package ratelimit

import "time"

// bucket is a token bucket with exactly the arithmetic of
// golang.org/x/time/rate.Limiter (v0.16.0) for the calls the engine makes
// (NewLimiter, AllowN, TokensAt, SetLimitAt, SetBurstAt, Limit, Burst),
// minus what the engine does not need:
//
//   - no mutex: every bucket belongs to an identity and is only used under
//     its shard's lock, so rate.Limiter's own lock was a second, always
//     uncontended lock on every decision;
//   - instants are int64 UnixNano, not time.Time: the engine converts the
//     caller's instant once per decision, where rate.Limiter did a
//     time.Time Sub (and Before, and two Time copies) per call;
//   - no lastEvent (only Reserve/Wait, which the engine never calls, use
//     it), so a bucket is 32 bytes held by value in its identity, where a
//     *rate.Limiter was a pointer to 80.
//
// It replaces rate.Limiter, which DESIGN.md names, because on the
// benchmark's watch round trip (BenchmarkDecide/watch) rate.Limiter was
// about 25–30% of the CPU time (its mutex, time.Time arithmetic and the
// pointer chase), and Decide is meant to take at most 150 ns. The
// semantics are rate.Limiter's, float for float: the tokens held, a refill
// of limit tokens per second up to burst, AllowN taking n tokens only when
// all n are there (never more than burst), SetLimitAt and SetBurstAt
// advancing to their instant first so accrued tokens are kept, and an
// instant earlier than the last one adding no tokens (the engine's
// identity clock never passes one anyway). TestBucketMatchesRateLimiter and
// FuzzBucketMatchesRateLimiter run random call sequences against
// rate.Limiter and require bit-identical tokens and the same answers.
//
// The zero bucket is "not limited" (limit 0); the engine only calls a
// bucket with limit > 0. Limit is in tokens per second, never rate.Inf.
type bucket struct {
	limit  float64
	tokens float64
	// last is the instant (UnixNano) tokens was computed at.
	last  int64
	burst int
}

// newBucket is rate.NewLimiter(limit, burst) first used at or after now:
// it starts full. (rate.Limiter starts at the zero time.Time, so its
// first advance adds more than burst tokens and is capped at burst; one
// that starts at now with burst tokens holds exactly the same.)
func newBucket(now int64, limit float64, burst int) bucket {
	return bucket{limit: limit, tokens: float64(burst), last: now, burst: burst}
}

// limited reports whether the bucket limits anything.
func (b *bucket) limited() bool { return b.limit > 0 }

// advance is rate.Limiter.advance: the tokens held at now, not stored.
func (b *bucket) advance(now int64) float64 {
	last := b.last
	if now < last {
		last = now
	}
	// time.Duration.Seconds, as rate.Limit.tokensFromDuration computes it.
	delta := time.Duration(now-last).Seconds() * b.limit
	tokens := b.tokens + delta
	if burst := float64(b.burst); tokens > burst {
		tokens = burst
	}
	return tokens
}

// tokensAt is rate.Limiter.TokensAt.
func (b *bucket) tokensAt(now int64) float64 { return b.advance(now) }

// allowN is rate.Limiter.AllowN: it takes n tokens at now when the bucket
// holds them (and n ≤ burst), and otherwise changes nothing.
func (b *bucket) allowN(now int64, n int) bool {
	tokens := b.advance(now) - float64(n)
	// rate.Limiter computes a wait when tokens < 0 and admits only when
	// it is ≤ 0: durationFromTokens(-tokens) truncates to whole
	// nanoseconds, so a deficit under a nanosecond's worth of tokens is
	// admitted, here as there.
	if n > b.burst || (tokens < 0 && durationFromTokens(-tokens, b.limit) > 0) {
		return false
	}
	b.last = now
	b.tokens = tokens
	return true
}

// giveBack returns n tokens taken for something that did not happen, up to
// the burst.
func (b *bucket) giveBack(n float64) {
	b.tokens = min(b.tokens+n, float64(b.burst))
}

// durationFromTokens is rate.Limit.durationFromTokens for limit > 0.
func durationFromTokens(tokens, limit float64) time.Duration {
	d := (tokens / limit) * float64(time.Second)
	if d > float64(1<<63-1) {
		return 1<<63 - 1
	}
	return time.Duration(d)
}

// setLimitAt is rate.Limiter.SetLimitAt.
func (b *bucket) setLimitAt(now int64, limit float64) {
	b.tokens = b.advance(now)
	b.last = now
	b.limit = limit
}

// setBurstAt is rate.Limiter.SetBurstAt.
func (b *bucket) setBurstAt(now int64, burst int) {
	b.tokens = b.advance(now)
	b.last = now
	b.burst = burst
}
