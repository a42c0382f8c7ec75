package guard

import (
	"fmt"
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
	// defaultMaxWatchesPerIdentityDivisor derives the default of
	// Options.MaxWatchesPerIdentity: a quarter of MaxWatches, so that at
	// least four callers fill a replica, and one caller alone never does.
	defaultMaxWatchesPerIdentityDivisor = 4
	// perUserDivisor derives the cap of one user behind an impersonating
	// caller: a quarter of the caller's, so that at least four of its users
	// fill it, and one alone never does.
	perUserDivisor = 4
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
	// GuardMaxWatchesPerUser: the user an impersonating caller acts as
	// holds a quarter of the caller's MaxWatchesPerIdentity already;
	// answered 429.
	GuardMaxWatchesPerUser = "MaxWatchesPerUser"
	// GuardFairShare: the replica, the caller's tenant or the caller is
	// near its cap (or the replica near its memory mark) and the tenant,
	// caller or user asking holds its fair share of it or more; answered
	// 429.
	GuardFairShare = "FairShare"
)

// Guard protects the replica itself, whatever the budgets say, and
// shares it fairly over a tree of flows (see Flow): tenants (a namespace's
// service accounts together, any other caller alone), their callers
// (authenticated identities), and the users an impersonating caller acts
// as. Each level is shared max-min, like API Priority and Fairness shares
// seats among flows, without ever cutting an open watch:
//
//   - above the memory high-water mark no new watch is admitted, so that
//     the pod answers 503 instead of being OOM-killed (and taking every
//     routed agent's watches with it);
//   - at maxWatches no new watch is admitted;
//   - a tenant that holds perIdentity watches gets no more: twelve
//     service accounts of one namespace hold what one caller may;
//   - a user behind an impersonating caller that holds a quarter of
//     perIdentity gets no more, so that one user cannot take its caller's
//     place from the next; the caller as a whole keeps perIdentity;
//   - near a cap (fairShareFromPercent of it) whoever holds its fair share
//     or more of it gets no more, while those below their share still get
//     in: callers of a tenant near perIdentity, users of a caller near
//     perIdentity, tenants of the replica near maxWatches (or near
//     fairShareMemoryFraction of the memory mark) (see fairShare).
//
// The guard runs after the budget's decision, for admitted watches only:
// a rejected watch, or one waiting for its leader's verdict or its turn to
// open, holds no place.
//
// Each decision and release is O(1): one lock, three map lookups. State is
// one map entry per tenant, caller and user holding watches, so at most
// three per open watch. It is safe for concurrent use.
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

	mu      sync.Mutex
	open    int64                  // guarded by mu
	tenants map[string]*tenantHold // the tenants holding watches; guarded by mu
}

// New returns a Guard that admits at most maxWatches watches on the
// replica and perIdentity per caller (0: no cap), and none while the
// memory read reports is above highWaterPercent of its limit; clk is its
// Clock, the time its callers decide at.
func New(maxWatches, perIdentity, highWaterPercent int, read MemoryReader, clk clock.PassiveClock) *Guard {
	guardMaxWatches.Set(float64(maxWatches))
	return &Guard{
		maxWatches: int64(maxWatches), perIdentity: int64(perIdentity), highWater: float64(highWaterPercent) / 100, highWaterPercent: highWaterPercent,
		memory: newMemorySampler(read), Clock: clk, tenants: map[string]*tenantHold{},
	}
}

// guardState is what the guard knows when it decides one watch open.
type guardState struct {
	// open is the watches in flight before this one; held those of its
	// tenant; callers the tenants holding any, counting its tenant.
	open, held int64
	callers    int
	// callerHeld is what the watch's caller holds; tenantCallers the
	// callers of its tenant holding any, counting its caller.
	callerHeld    int64
	tenantCallers int
	// impersonated: the watch is a user's behind its caller; userHeld is
	// what that user holds, callerUsers the users of the caller holding
	// any, counting this one.
	impersonated bool
	userHeld     int64
	callerUsers  int
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
	case perIdentity > 0 && s.impersonated && s.userHeld >= max(1, perIdentity/perUserDivisor):
		return GuardMaxWatchesPerUser
	case perIdentity > 0 && near(s.held, perIdentity) && s.callerHeld >= share(perIdentity, s.tenantCallers):
		return GuardFairShare
	case perIdentity > 0 && s.impersonated && near(s.callerHeld, perIdentity) && s.userHeld >= share(perIdentity, s.callerUsers):
		return GuardFairShare
	}
	if (near(s.open, maxWatches) || s.nearMemory) && s.held >= fairShare(s, maxWatches) {
		return GuardFairShare
	}
	return ""
}

// near reports whether held is at fairShareFromPercent of capacity or
// more; never for no capacity.
func near(held, capacity int64) bool {
	return capacity > 0 && held*100 >= capacity*fairShareFromPercent
}

// share is capacity divided evenly among n, rounded up, at least 1.
func share(capacity int64, n int) int64 {
	return max(1, (capacity+int64(n)-1)/int64(max(n, 1)))
}

// fairShare is the most watches one tenant may hold while the replica is
// near its limits: the capacity (maxWatches, or the watches open when there
// is no cap and memory is what runs short) divided evenly among the tenants
// holding watches, counting the one asking, and at least 1. A tenant below
// it is admitted up to the cap itself, one above it is not, so the last
// quarter of a replica goes to the tenants that hold the least: max-min
// fairness, without ever cutting an open watch. The callers of a tenant
// and the users of a caller share their level's cap the same way.
func fairShare(s guardState, maxWatches int64) int64 {
	capacity := maxWatches
	if capacity <= 0 {
		capacity = s.open
	}
	return share(capacity, s.callers)
}

// Admit takes a place for one watch of caller in its own name at now; see
// AdmitFlow.
func (g *Guard) Admit(now time.Time, caller string) (reason string, s *MemorySample) {
	return g.AdmitFlow(now, FlowOf(caller, ""))
}

// Release gives back a place Admit took for caller.
func (g *Guard) Release(caller string) { g.ReleaseFlow(FlowOf(caller, "")) }

// AdmitFlow takes a place for one watch of flow f at now, or returns the
// reason it cannot; after "", call ReleaseFlow(f) when the watch ends.
func (g *Guard) AdmitFlow(now time.Time, f Flow) (reason string, s *MemorySample) {
	s = g.memory.at(now)
	if reason = g.bufferedVerdict(f.Caller, s); reason != "" {
		return reason, s
	}
	st := guardState{highWater: g.memoryRefuses(f.Caller, s), nearMemory: s.above(g.highWater * fairShareMemoryFraction), impersonated: f.User != ""}
	if s.above(g.highWater) {
		g.memory.reclaim(now)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	st.open, st.callers = g.open, len(g.tenants)
	t := g.tenants[f.Tenant]
	var c *callerHold
	if t != nil {
		st.held, st.tenantCallers = t.held, len(t.callers)
		c = t.callers[f.Caller]
	} else {
		st.callers++
	}
	if c != nil {
		st.callerHeld, st.callerUsers = c.held, len(c.users)
		st.userHeld = c.users[f.User]
	} else {
		st.tenantCallers++
	}
	if st.impersonated && st.userHeld == 0 {
		st.callerUsers++
	}
	if reason = guardVerdict(st, g.maxWatches, g.perIdentity); reason != "" {
		return reason, s
	}
	g.open++
	if t == nil {
		t = &tenantHold{callers: map[string]*callerHold{}}
		g.tenants[f.Tenant] = t
	}
	if c == nil {
		c = &callerHold{}
		t.callers[f.Caller] = c
	}
	t.held++
	c.held++
	if st.impersonated {
		if c.users == nil {
			c.users = map[string]int64{}
		}
		c.users[f.User]++
	}
	guardCallers.Set(float64(len(g.tenants)))
	return "", s
}

// ReleaseFlow gives back a place AdmitFlow took for f.
func (g *Guard) ReleaseFlow(f Flow) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.tenants[f.Tenant]
	if t == nil {
		return
	}
	c := t.callers[f.Caller]
	if c == nil {
		return
	}
	g.open--
	t.held--
	c.held--
	if f.User != "" {
		if n := c.users[f.User] - 1; n > 0 {
			c.users[f.User] = n
		} else {
			delete(c.users, f.User)
		}
	}
	if c.held <= 0 {
		delete(t.callers, f.Caller)
	}
	if t.held <= 0 {
		delete(g.tenants, f.Tenant)
	}
	guardCallers.Set(float64(len(g.tenants)))
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
			"watchgate forwards its maximum of %d watches per identity on this replica for you (a namespace's service accounts together count as one), please try again in %ds",
			g.perIdentity, RetryAfterSeconds), RetryAfterSeconds)
	case GuardMaxWatchesPerUser:
		e = apierrors.NewTooManyRequests(fmt.Sprintf(
			"watchgate forwards at most %d watches on this replica for one user your agent impersonates, a quarter of the agent's, please try again in %ds",
			max(1, g.perIdentity/perUserDivisor), RetryAfterSeconds), RetryAfterSeconds)
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
	case GuardMaxWatchesPerUser:
		return fmt.Sprintf("the user you impersonate holds a quarter of --max-watches-per-identity=%d watches", g.perIdentity)
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
		Help: "Watch opens a budget admitted and the replica's own guard refused, by reason (MemoryHighWater, MaxWatches, MaxWatchesPerIdentity, MaxWatchesPerUser, FairShare, WatchOpenRate, WatchOpenQueue, BufferedBytes, MaxListsPerIdentity; the last two and MemoryHighWater also for lists).",
	}, []string{"reason"})

	guardCallers = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_guard_callers",
		Help: "Tenants (a namespace's service accounts together, any other authenticated identity alone) holding at least one watch through this replica, among whom its watches are shared near its limits.",
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
