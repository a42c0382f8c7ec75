package ratelimit

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// bucketOracle drives a bucket and a rate.Limiter through the same calls
// and fails on the first difference: an answer, or the tokens held, bit
// for bit. Instants are wall-clock only (time.Unix), as the engine's are.
type bucketOracle struct {
	t    *testing.T
	b    bucket
	lim  *rate.Limiter
	now  int64
	step int
}

func newBucketOracle(t *testing.T, now int64, perMinute int32, burst int) *bucketOracle {
	limit := float64(perMinute) / 60
	return &bucketOracle{t: t, b: newBucket(now, limit, burst), lim: rate.NewLimiter(rate.Limit(limit), burst), now: now}
}

// run performs op (its low bits choose the call) after moving the clock by
// dt nanoseconds (negative: an instant out of order), with arg as n, limit
// or burst.
func (o *bucketOracle) run(op uint8, dt int64, arg uint32) {
	o.t.Helper()
	o.step++
	o.now += dt
	at := time.Unix(0, o.now)
	switch op % 5 {
	case 0, 1: // the common call
		n := int(arg % 128)
		if got, want := o.b.allowN(o.now, n), o.lim.AllowN(at, n); got != want {
			o.t.Fatalf("step %d: allowN(%d) = %v, rate.Limiter says %v", o.step, n, got, want)
		}
	case 2:
		if got, want := o.b.tokensAt(o.now), o.lim.TokensAt(at); math.Float64bits(got) != math.Float64bits(want) {
			o.t.Fatalf("step %d: tokensAt = %v, rate.Limiter says %v", o.step, got, want)
		}
	case 3:
		limit := float64(arg%600_000+1) / 60
		o.b.setLimitAt(o.now, limit)
		o.lim.SetLimitAt(at, rate.Limit(limit))
	case 4:
		burst := int(arg % 1000)
		o.b.setBurstAt(o.now, burst)
		o.lim.SetBurstAt(at, burst)
	}
	if got, want := o.b.tokensAt(o.now), o.lim.TokensAt(at); math.Float64bits(got) != math.Float64bits(want) {
		o.t.Fatalf("step %d (op %d): tokens %v, rate.Limiter holds %v", o.step, op%5, got, want)
	}
	if o.b.burst != o.lim.Burst() || o.b.limit != float64(o.lim.Limit()) {
		o.t.Fatalf("step %d: burst %d limit %v, rate.Limiter %d %v", o.step, o.b.burst, o.b.limit, o.lim.Burst(), o.lim.Limit())
	}
}

// TestBucketMatchesRateLimiter runs random call sequences (drains, refills,
// limit and burst changes, instants out of order) against rate.Limiter.
func TestBucketMatchesRateLimiter(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		o := newBucketOracle(t, t0.UnixNano()+rng.Int64N(1e15), int32(rng.IntN(600_000)+1), rng.IntN(200))
		for range 500 {
			var dt int64
			switch rng.IntN(4) {
			case 0: // a burst of calls
			case 1:
				dt = rng.Int64N(int64(time.Millisecond))
			case 2:
				dt = rng.Int64N(int64(10 * time.Second))
			case 3:
				dt = -rng.Int64N(int64(time.Second))
			}
			o.run(uint8(rng.IntN(5)), dt, rng.Uint32())
		}
	}
}

// TestBucketMatchesRateLimiterAtTheEdge asks for tokens within a few
// nanoseconds of when they are due, where rate.Limiter admits a deficit of
// less than a nanosecond's worth of tokens.
func TestBucketMatchesRateLimiterAtTheEdge(t *testing.T) {
	for perMinute := int32(1); perMinute <= 600_000; perMinute = perMinute*3 + 1 {
		for burst := 1; burst <= 7; burst += 3 {
			o := newBucketOracle(t, t0.UnixNano(), perMinute, burst)
			for i := range 400 {
				n := i%burst + 1
				due := durationFromTokens(float64(n)-o.b.tokensAt(o.now), o.b.limit)
				o.run(0, max(int64(due)+int64(i%5)-2, 0), uint32(n))
			}
		}
	}
}

// FuzzBucketMatchesRateLimiter: each 13 bytes of input are one call (op,
// clock step in ns, argument).
func FuzzBucketMatchesRateLimiter(f *testing.F) {
	f.Add(int32(6000), uint8(100), []byte("\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x05"))
	f.Add(int32(1), uint8(1), []byte("\x01\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x02\x03\x00\x10\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, perMinute int32, burst uint8, calls []byte) {
		if perMinute <= 0 {
			return
		}
		o := newBucketOracle(t, t0.UnixNano(), perMinute, int(burst))
		for ; len(calls) >= 13; calls = calls[13:] {
			// At most ±2^40 ns (about 18 min) per step, so no sum overflows.
			dt := int64(binary.LittleEndian.Uint64(calls[1:])) >> 23
			o.run(calls[0], dt, binary.LittleEndian.Uint32(calls[9:]))
		}
	})
}
