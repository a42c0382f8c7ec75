package proxy

import (
	"fmt"
	"math"
	"net/http"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/watchgate/watchgate/ratelimit"
)

const (
	// DefaultMemoryHighWaterPercent is the default of
	// Options.MemoryHighWaterPercent: new watches are refused once the Go
	// runtime's memory in use passes 85% of its memory limit (GOMEMLIMIT).
	DefaultMemoryHighWaterPercent = 85
	// DefaultMaxWatches is the default of --max-watches: the watches one
	// replica forwards at once with the chart's default memory limit
	// (512 Mi, GOMEMLIMIT 90% of it). Measured: BENCHMARKS.md, "load".
	DefaultMaxWatches = 4000
	// memorySampleInterval is how often the guard reads the runtime's
	// memory; between samples a watch open costs two atomic loads.
	memorySampleInterval = 250 * time.Millisecond
	// guardRetryAfterSeconds is the Retry-After of a guard refusal: long
	// enough for watches to end or the collector to catch up, short enough
	// for client-go's REST client, which waits and retries up to 10 times.
	guardRetryAfterSeconds = 5
)

// Guard reasons, in X-Watchgate-Decision and
// watchgate_proxy_guard_rejections_total.
const (
	// GuardMemoryHighWater: memory in use above the high-water mark of the
	// memory limit; answered 503 ServiceUnavailable.
	GuardMemoryHighWater = "MemoryHighWater"
	// GuardMaxWatches: the replica forwards MaxWatches watches already;
	// answered 429 TooManyRequests.
	GuardMaxWatches = "MaxWatches"
)

// MemoryReader returns the memory the process uses and the limit it must
// stay within, in bytes; limit 0 or math.MaxUint64 means none.
type MemoryReader func() (inUse, limit uint64)

// RuntimeMemory is the default MemoryReader: the Go runtime's own view —
// every byte the runtime has mapped (/memory/classes/total:bytes) except
// heap memory returned to the OS (/memory/classes/heap/released:bytes) and
// free heap spans it keeps for reuse (/memory/classes/heap/free:bytes),
// which the scavenger gives back as GOMEMLIMIT nears, against
// /gc/gomemlimit:bytes (GOMEMLIMIT or debug.SetMemoryLimit; math.MaxInt64
// when unset). Counting the free spans refused watches while a replica's
// watches churned with RSS at half its limit (BENCHMARKS.md, "load"). It
// costs about a microsecond; the guard calls it at most every 250ms.
func RuntimeMemory() (inUse, limit uint64) {
	s := [4]metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/gc/gomemlimit:bytes"},
	}
	metrics.Read(s[:])
	for _, v := range s {
		if v.Value.Kind() != metrics.KindUint64 {
			return 0, 0 // unknown to this runtime: no memory check
		}
	}
	total, released, free, lim := s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64(), s[3].Value.Uint64()
	if lim >= math.MaxInt64 {
		lim = 0
	}
	return total - min(released+free, total), lim
}

// memorySample is one reading and when it was taken.
type memorySample struct {
	at           time.Time
	inUse, limit uint64
}

// watchGuard protects the replica itself, whatever the budgets say: it
// refuses new watches when the process nears its memory limit, so that the
// pod answers 503 instead of being OOM-killed (and taking every routed
// agent's watches with it), and when it already forwards maxWatches. Open
// watches are never cut. It is safe for concurrent use.
type watchGuard struct {
	// maxWatches caps watch requests in flight through the replica; 0 is
	// no cap.
	maxWatches int64
	// highWater is the fraction of the memory limit above which new
	// watches are refused; at 1 or above, or without a limit, memory is
	// not checked.
	highWater float64
	read      MemoryReader
	clock     clock.PassiveClock
	every     time.Duration

	open   atomic.Int64
	sample atomic.Pointer[memorySample]
	// sampling is held by the one caller refreshing the sample.
	sampling sync.Mutex
}

func newWatchGuard(maxWatches, highWaterPercent int, read MemoryReader, clk clock.PassiveClock) *watchGuard {
	if read == nil {
		read = RuntimeMemory
	}
	g := &watchGuard{
		maxWatches: int64(maxWatches), highWater: float64(highWaterPercent) / 100,
		read: read, clock: clk, every: memorySampleInterval,
	}
	g.sample.Store(&memorySample{})
	return g
}

// guardVerdict decides one watch open: "" to admit, else the Guard reason.
// open counts the watches in flight before this one. Memory is checked
// first: it is the limit that kills the pod.
func guardVerdict(open, maxWatches int64, inUse, limit uint64, highWater float64) string {
	if highWater > 0 && highWater < 1 && limit > 0 && float64(inUse) > highWater*float64(limit) {
		return GuardMemoryHighWater
	}
	if maxWatches > 0 && open >= maxWatches {
		return GuardMaxWatches
	}
	return ""
}

// memory returns a sample at most g.every old at now, refreshing it when
// it is older and no other caller is refreshing it already.
func (g *watchGuard) memory(now time.Time) *memorySample {
	s := g.sample.Load()
	if now.Sub(s.at) < g.every || !g.sampling.TryLock() {
		return s
	}
	defer g.sampling.Unlock()
	inUse, limit := g.read()
	s = &memorySample{at: now, inUse: inUse, limit: limit}
	g.sample.Store(s)
	memoryInUseBytes.Set(float64(inUse))
	memoryLimitBytes.Set(float64(limit))
	return s
}

// admit takes a place for one watch at now, or returns the reason it
// cannot; after "", call release when the watch ends.
func (g *watchGuard) admit(now time.Time) (reason string, s *memorySample) {
	s = g.memory(now)
	for {
		open := g.open.Load()
		if r := guardVerdict(open, g.maxWatches, s.inUse, s.limit, g.highWater); r != "" {
			return r, s
		}
		if g.open.CompareAndSwap(open, open+1) {
			return "", s
		}
	}
}

func (g *watchGuard) release() { g.open.Add(-1) }

// withWatchGuard refuses new watches the replica cannot afford (see
// watchGuard) before any budget is consulted, with a Status and
// Retry-After that client-go waits for and retries: 503 above the memory
// high-water mark, 429 at MaxWatches. Everything but watch opens passes;
// a nil g lets everything pass.
func withWatchGuard(g *watchGuard, next http.Handler) http.Handler {
	if g == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := classificationFrom(r.Context())
		if !ok || c.Verb != ratelimit.VerbWatch {
			next.ServeHTTP(w, r)
			return
		}
		reason, s := g.admit(g.clock.Now())
		if reason == "" {
			defer g.release()
			next.ServeHTTP(w, r)
			return
		}
		guardRejections.WithLabelValues(reason).Inc()
		requestsTotal.WithLabelValues("watch", "reject", reason, "", "").Inc()
		w.Header().Set(DecisionHeader, formatDecision("reject", reason, "", guardRetryAfterSeconds))
		var e *apierrors.StatusError
		if reason == GuardMemoryHighWater {
			e = serviceUnavailable(fmt.Sprintf(
				"watchgate is near its memory limit (%d of %d MiB in use) and accepts no new watches for now, please try again in %ds",
				s.inUse>>20, s.limit>>20, guardRetryAfterSeconds), guardRetryAfterSeconds)
		} else {
			e = apierrors.NewTooManyRequests(fmt.Sprintf(
				"watchgate forwards its maximum of %d watches on this replica, please try again in %ds",
				g.maxWatches, guardRetryAfterSeconds), guardRetryAfterSeconds)
		}
		writeStatus(w, r, e)
	})
}

// The guard's metrics, next to the guard (registered with the proxy's).
var (
	guardRejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_guard_rejections_total",
		Help: "Watch opens refused by the replica's own guard before any budget, by reason (MemoryHighWater, MaxWatches).",
	}, []string{"reason"})

	memoryInUseBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_memory_in_use_bytes",
		Help: "Memory the Go runtime uses, as the watch guard last sampled it (mapped, minus released to the OS and free heap spans).",
	})

	memoryLimitBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_memory_limit_bytes",
		Help: "The Go runtime's memory limit (GOMEMLIMIT) as the watch guard last sampled it; 0 when none is set.",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(guardRejections, memoryInUseBytes, memoryLimitBytes)
}
