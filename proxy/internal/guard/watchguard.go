package guard

import (
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/watchgate/watchgate/proxy/internal/answer"
)

const (
	// watchMemoryBytes is the memory MaxWatchesFor gives each open watch:
	// an idle watch holds 13–14 KiB of Go heap and 4 KiB of goroutine
	// stack in the proxy, 19–21 KiB of RSS (make load, HTTP/2 on both
	// hops), and a 1 GiB replica held 30,000 opened at once, and 1% of
	// them reopened each second, with no refusal and RSS at most 928 MiB.
	// 26 KiB leaves room over the memory the guard counts (live memory,
	// 15–17 KiB a watch) for the heap's growth between collections, and
	// keeps a full replica under the guard's mark at 512Mi, 1Gi and 2Gi
	// limits, so that it answers 429 MaxWatches rather than 503.
	watchMemoryBytes = 26 << 10
	// baseMemoryBytes is what MaxWatchesFor sets aside for the process
	// without watches: the manager, its informers, the engine, the caches.
	baseMemoryBytes = 64 << 20
	// minMaxWatches is the smallest cap MaxWatchesFor derives.
	minMaxWatches = 100
	// DefaultMaxWatches is MaxWatchesFor the chart's default memory
	// (GOMEMLIMIT 460 MiB, 90% of the 512Mi limit): 15,596; also the cap
	// when the process's memory cannot be read.
	DefaultMaxWatches = (460<<20 - baseMemoryBytes) / watchMemoryBytes
	// defaultMaxWatchesPerIdentityDivisor derives the default of
	// Options.MaxWatchesPerIdentity: a quarter of MaxWatches, so that at
	// least four callers fill a replica, and one caller alone never does.
	defaultMaxWatchesPerIdentityDivisor = 4
	// fairShareFromPercent is how full the replica must be, in percent of
	// MaxWatches, before each caller is held to its fair share.
	fairShareFromPercent = 75
	// fairShareMemoryFraction is the fraction of the memory high-water
	// mark above which each caller is held to its fair share.
	fairShareMemoryFraction = 0.9
	// RetryAfterSeconds is the Retry-After of a guard refusal: long
	// enough for watches to end or the collector to catch up, short enough
	// for client-go's REST client, which waits and retries up to 10 times.
	RetryAfterSeconds = 5
)

// MaxWatchesFor is the default of --max-watches for a process that runs
// under l (ProcessMemoryLimit):
//
//	(GOMEMLIMIT − 64 MiB) ÷ 26 KiB       with GOMEMLIMIT
//	(limit ÷ 2 − 64 MiB) ÷ 26 KiB        with only a cgroup limit or physical memory
//
// at least 100, and DefaultMaxWatches when l is unknown. Under GOMEMLIMIT
// the collector works to keep the heap within it, and the memory guard
// (--memory-high-water-percent, 85% of it) refuses before it: the cap
// leaves the guard room for garbage, so that a full replica answers 429
// MaxWatches rather than 503. Without GOMEMLIMIT the collector lets the
// heap grow to twice what is live before it collects (GOGC 100), so only
// half of the limit counts. With the chart's GOMEMLIMIT (90% of
// resources.limits.memory) that is about 33,000 watches per GiB of limit.
func MaxWatchesFor(l MemoryLimit) int {
	budget := l.Bytes
	switch l.Source {
	case MemoryLimitFromGoMemLimit:
	case MemoryLimitFromCgroup, MemoryLimitFromPhysical:
		budget /= 2
	default:
		return DefaultMaxWatches
	}
	if budget <= baseMemoryBytes {
		return minMaxWatches
	}
	return int(max(minMaxWatches, min((budget-baseMemoryBytes)/watchMemoryBytes, math.MaxInt32)))
}

// DefaultMaxWatchesPerIdentity is the cap per caller that MaxWatchesPerIdentity
// 0 stands for: a quarter of maxWatches, at least 1; 0 (none) without
// maxWatches.
func DefaultMaxWatchesPerIdentity(maxWatches int) int {
	if maxWatches <= 0 {
		return 0
	}
	return max(1, maxWatches/defaultMaxWatchesPerIdentityDivisor)
}

// Guard reasons, in X-Watchgate-Decision and
// watchgate_proxy_guard_rejections_total.
const (
	// GuardMemoryHighWater: memory in use above the high-water mark of the
	// memory limit; answered 503 ServiceUnavailable.
	GuardMemoryHighWater = "MemoryHighWater"
	// GuardMaxWatches: the replica forwards MaxWatches watches already;
	// answered 429 TooManyRequests.
	GuardMaxWatches = "MaxWatches"
	// GuardMaxWatchesPerIdentity: the caller holds MaxWatchesPerIdentity
	// of the replica's watches already; answered 429.
	GuardMaxWatchesPerIdentity = "MaxWatchesPerIdentity"
	// GuardFairShare: the replica is near its watch cap or memory mark and
	// the caller holds its fair share of the watches or more; answered
	// 429.
	GuardFairShare = "FairShare"
)

// Guard protects the replica itself, whatever the budgets say, and
// shares it fairly among the callers (authenticated identities, the ones
// whose credentials the connection carries, never an impersonated name):
//
//   - above the memory high-water mark no new watch is admitted, so that
//     the pod answers 503 instead of being OOM-killed (and taking every
//     routed agent's watches with it);
//   - at maxWatches no new watch is admitted;
//   - a caller that holds perIdentity watches gets no more;
//   - near the limits (fairShareFromPercent of maxWatches, or
//     fairShareMemoryFraction of the memory mark) a caller that holds its
//     fair share or more gets no more, while callers below their share still
//     get in: max-min fairness over the callers holding watches (see
//     fairShare).
//
// Open watches are never cut. The guard runs after the budget's decision,
// for admitted watches only: a rejected watch, or one waiting for its
// leader's verdict, holds no place.
//
// Each decision and release is O(1): one lock, one map lookup. State is
// one map entry per caller holding watches (the key shares the caller's
// name with its requests), so at most one per open watch. It is safe for
// concurrent use.
type Guard struct {
	// maxWatches caps watches in flight through the replica; 0 is no cap.
	maxWatches int64
	// perIdentity caps one caller's watches in flight; 0 is no cap.
	perIdentity int64
	// highWater is the fraction of the memory limit above which new
	// watches are refused; at 1 or above, or without a limit, memory is
	// not checked.
	highWater float64
	// highWaterPercent is highWater in percent, as the flag set it.
	highWaterPercent int
	memory           *memorySampler
	Clock            clock.PassiveClock
	// Streams, when not nil, accounts the bytes callers' streams hold
	// buffered: above the memory mark only the callers holding the most
	// are refused, and a caller at its share of bytes is (streamguard.go).
	Streams *Streams

	mu   sync.Mutex
	open int64            // guarded by mu
	held map[string]int64 // watches per caller holding any; guarded by mu
}

// New returns a Guard that admits at most maxWatches watches on the
// replica and perIdentity per caller (0: no cap), and none while the
// memory read reports is above highWaterPercent of its limit; clk is its
// Clock, the time its callers decide at.
func New(maxWatches, perIdentity, highWaterPercent int, read MemoryReader, clk clock.PassiveClock) *Guard {
	guardMaxWatches.Set(float64(maxWatches))
	return &Guard{
		maxWatches: int64(maxWatches), perIdentity: int64(perIdentity), highWater: float64(highWaterPercent) / 100, highWaterPercent: highWaterPercent,
		memory: newMemorySampler(read), Clock: clk, held: map[string]int64{},
	}
}

// guardState is what the guard knows when it decides one watch open.
type guardState struct {
	// open is the watches in flight before this one; held those of its
	// caller; callers the callers holding any.
	open, held int64
	callers    int
	// highWater: memory is above the high-water mark; nearMemory: above
	// fairShareMemoryFraction of it.
	highWater, nearMemory bool
}

// guardVerdict decides one watch open: "" to admit, else the Guard reason.
// Memory is checked first: it is the limit that kills the pod.
func guardVerdict(s guardState, maxWatches, perIdentity int64) string {
	switch {
	case s.highWater:
		return GuardMemoryHighWater
	case maxWatches > 0 && s.open >= maxWatches:
		return GuardMaxWatches
	case perIdentity > 0 && s.held >= perIdentity:
		return GuardMaxWatchesPerIdentity
	}
	nearCap := maxWatches > 0 && s.open*100 >= maxWatches*fairShareFromPercent
	if (nearCap || s.nearMemory) && s.held >= fairShare(s, maxWatches) {
		return GuardFairShare
	}
	return ""
}

// fairShare is the most watches one caller may hold while the replica is
// near its limits: the capacity (maxWatches, or the watches open when there
// is no cap and memory is what runs short) divided evenly among the callers
// holding watches, counting the one asking, and at least 1. A caller below
// it is admitted up to the cap itself, one above it is not, so the last
// quarter of a replica goes to the callers that hold the least: max-min
// fairness, without ever cutting an open watch.
func fairShare(s guardState, maxWatches int64) int64 {
	callers := int64(s.callers)
	if s.held == 0 {
		callers++
	}
	capacity := maxWatches
	if capacity <= 0 {
		capacity = s.open
	}
	return max(1, (capacity+callers-1)/callers)
}

// Admit takes a place for one watch of caller at now, or returns the
// reason it cannot; after "", call release(caller) when the watch ends.
func (g *Guard) Admit(now time.Time, caller string) (reason string, s *MemorySample) {
	s = g.memory.at(now)
	if reason = g.bufferedVerdict(caller, s); reason != "" {
		return reason, s
	}
	st := guardState{highWater: g.memoryRefuses(caller, s), nearMemory: s.above(g.highWater * fairShareMemoryFraction)}
	if s.above(g.highWater) {
		g.memory.reclaim(now)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	st.open, st.held, st.callers = g.open, g.held[caller], len(g.held)
	if reason = guardVerdict(st, g.maxWatches, g.perIdentity); reason != "" {
		return reason, s
	}
	g.open++
	g.held[caller] = st.held + 1
	guardCallers.Set(float64(len(g.held)))
	return "", s
}

// Release gives back a place admit took for caller.
func (g *Guard) Release(caller string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open--
	if n := g.held[caller] - 1; n > 0 {
		g.held[caller] = n
	} else {
		delete(g.held, caller)
	}
	guardCallers.Set(float64(len(g.held)))
}

// Refuse answers a watch the guard refused for reason, with a Status and
// Retry-After that client-go waits for and retries: 503 above the memory
// high-water mark, 429 otherwise.
func (g *Guard) Refuse(w http.ResponseWriter, r *http.Request, reason string, s *MemorySample) {
	Rejections.WithLabelValues(reason).Inc()
	w.Header().Set(answer.DecisionHeader, answer.FormatDecision("reject", reason, "", RetryAfterSeconds))
	var e *apierrors.StatusError
	switch reason {
	case GuardMemoryHighWater:
		e = answer.ServiceUnavailable(fmt.Sprintf(
			"watchgate is near its memory limit (%d of %d MiB in use) and accepts no new watches or lists for now from the callers holding the most of it, please try again in %ds",
			s.inUse>>20, s.limit>>20, RetryAfterSeconds), RetryAfterSeconds)
	case GuardMaxWatchesPerIdentity:
		e = apierrors.NewTooManyRequests(fmt.Sprintf(
			"watchgate forwards its maximum of %d watches per identity on this replica for you, please try again in %ds",
			g.perIdentity, RetryAfterSeconds), RetryAfterSeconds)
	case GuardBufferedBytes, GuardMaxListsPerIdentity:
		e = g.streamsRefusal(reason)
	case GuardFairShare:
		e = apierrors.NewTooManyRequests(fmt.Sprintf(
			"watchgate is near its capacity on this replica and you hold your fair share of its watches, please try again in %ds",
			RetryAfterSeconds), RetryAfterSeconds)
	default:
		e = apierrors.NewTooManyRequests(fmt.Sprintf(
			"watchgate forwards its maximum of %d watches on this replica, please try again in %ds",
			g.maxWatches, RetryAfterSeconds), RetryAfterSeconds)
	}
	answer.WriteStatus(w, r, e)
}

// RefusalText says, for a Warning header, which limit a refusal for reason
// met and which flag sets it; with the memory sample s (nil: not known),
// how much memory is in use.
func (g *Guard) RefusalText(reason string, s *MemorySample) string {
	switch reason {
	case GuardMemoryHighWater:
		if s != nil {
			return fmt.Sprintf("%d of %d MiB in use, above --memory-high-water-percent=%d", s.inUse>>20, s.limit>>20, g.highWaterPercent)
		}
		return fmt.Sprintf("memory in use above --memory-high-water-percent=%d", g.highWaterPercent)
	case GuardMaxWatchesPerIdentity:
		return fmt.Sprintf("you hold --max-watches-per-identity=%d watches", g.perIdentity)
	case GuardBufferedBytes, GuardMaxListsPerIdentity:
		return g.streamsRefusalText(reason)
	case GuardFairShare:
		if g.maxWatches <= 0 {
			return fmt.Sprintf("near --memory-high-water-percent=%d, you hold your fair share of the watches", g.highWaterPercent)
		}
		return fmt.Sprintf("near --max-watches=%d or --memory-high-water-percent=%d, you hold your fair share of the watches", g.maxWatches, g.highWaterPercent)
	default:
		return fmt.Sprintf("it forwards --max-watches=%d watches", g.maxWatches)
	}
}

// The guard's metrics, next to the guard (registered with the proxy's).
var (
	Rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_guard_rejections_total",
		Help: "Watch opens a budget admitted and the replica's own guard refused, by reason (MemoryHighWater, MaxWatches, MaxWatchesPerIdentity, FairShare, WatchOpenRate, BufferedBytes, MaxListsPerIdentity; the last two and MemoryHighWater also for lists).",
	}, []string{"reason"})

	guardCallers = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_guard_callers",
		Help: "Callers (authenticated identities) holding at least one watch through this replica, among whom its watches are shared near its limits.",
	})

	guardMaxWatches = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_max_watches",
		Help: "The replica's --max-watches: the most watches it forwards at once, beyond which new ones get 429 (0: no cap).",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(Rejections, guardCallers, guardMaxWatches)
}

// OpenCount is the number of watches holding a place.
func (g *Guard) OpenCount() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}
