package proxy

import (
	"github.com/watchgate/watchgate/proxy/internal/admit"
	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/proxy/internal/serve"
)

// DecisionHeader names the decision, its reason and the budget on every
// response to a request a budget governs or the watch guard refused, e.g.
//
//	X-Watchgate-Decision: allow; budget=agents
//	X-Watchgate-Decision: reject; reason=RateLimited; budget=agents; retry-after=2
//	X-Watchgate-Decision: dryrun-reject; reason=TooManyWatches; budget=agents
//	X-Watchgate-Decision: reject; reason=FairShare; retry-after=5
const DecisionHeader = answer.DecisionHeader

// ReviewFailurePolicy says what the proxy does with a request whose token
// or impersonation it cannot review because the API server's TokenReview
// or SubjectAccessReview failed or took longer than ReviewTimeout.
type ReviewFailurePolicy = review.FailurePolicy

const (
	// FailClosed answers 503 ServiceUnavailable with a Status and
	// Retry-After; nothing is forwarded. The default.
	FailClosed = review.FailClosed
	// FailOpen forwards the request and charges it to an identity the
	// caller cannot otherwise spend (see review.FailOpen).
	FailOpen = review.FailOpen
)

// The watch guard's limits and the memory they read (see
// proxy/internal/guard).
type (
	// MemoryReader returns the memory the process uses and the limit it
	// must stay within, in bytes; limit 0 or math.MaxUint64 means none.
	MemoryReader = guard.MemoryReader
	// MemoryLimit is the memory a process runs under and where it was
	// found; Bytes 0 when nothing says.
	MemoryLimit = guard.MemoryLimit
)

const (
	// Where a MemoryLimit comes from: GOMEMLIMIT, the cgroup's memory
	// limit, or the fallback when neither is set (see
	// guard.ProcessMemoryLimit).
	MemoryLimitFromGoMemLimit = guard.MemoryLimitFromGoMemLimit
	MemoryLimitFromCgroup     = guard.MemoryLimitFromCgroup
	MemoryLimitFromFallback   = guard.MemoryLimitFromFallback
	MemoryLimitOff            = guard.MemoryLimitOff
	// DefaultMemoryHighWaterPercent is Options.MemoryHighWaterPercent's
	// default.
	DefaultMemoryHighWaterPercent = guard.DefaultMemoryHighWaterPercent

	// The reasons the watch guard refuses a watch, in
	// X-Watchgate-Decision and the Warning header.
	GuardMemoryHighWater       = guard.GuardMemoryHighWater
	GuardMaxWatches            = guard.GuardMaxWatches
	GuardMaxWatchesPerIdentity = guard.GuardMaxWatchesPerIdentity
	GuardMaxWatchesPerUser     = guard.GuardMaxWatchesPerUser
	GuardFairShare             = guard.GuardFairShare
	// GuardBufferedBytes and GuardMaxListsPerIdentity refuse watches and
	// lists of a caller whose streams hold its share of buffered bytes,
	// and lists beyond its lists in flight.
	GuardBufferedBytes       = guard.GuardBufferedBytes
	GuardMaxListsPerIdentity = guard.GuardMaxListsPerIdentity
	// DefaultStalledStreamTimeout and DefaultMaxListsPerIdentity are the
	// defaults of Options.StalledStreamTimeout and MaxListsPerIdentity.
	DefaultStalledStreamTimeout = guard.DefaultStalledStreamTimeout
	DefaultMaxListsPerIdentity  = guard.DefaultMaxListsPerIdentity
	// GuardWatchOpenRate: the caller opened its burst of watches faster
	// than its per-identity rate refills it.
	GuardWatchOpenRate = admit.GuardWatchOpenRate
	// GuardWatchOpenQueue: the watch open waited too long for its turn
	// among the watch opens in flight upstream.
	GuardWatchOpenQueue = admit.GuardWatchOpenQueue
	// DefaultMaxWatchOpensInFlight is the default of
	// Options.MaxWatchOpensInFlight.
	DefaultMaxWatchOpensInFlight = admit.DefaultMaxWatchOpensInFlight

	// DefaultWatchOpensPerIdentityPerSecond and
	// DefaultWatchOpenBurstPerIdentity are the defaults of
	// Options.WatchOpensPerIdentityPerSecond and WatchOpenBurstPerIdentity.
	DefaultWatchOpensPerIdentityPerSecond = admit.DefaultWatchOpensPerIdentityPerSecond
	DefaultWatchOpenBurstPerIdentity      = admit.DefaultWatchOpenBurstPerIdentity
)

// ProcessMemoryLimit is the memory this process runs under: GOMEMLIMIT
// when set, else its cgroup's memory limit, else a fallback of 512 MiB (at
// most a quarter of physical memory); without GOMEMLIMIT the process
// should set the Go runtime's limit to its GoMemLimit, which the memory
// guard reads.
func ProcessMemoryLimit() MemoryLimit { return guard.ProcessMemoryLimit() }

// MaxWatchesFor is the default of --max-watches for a process that runs
// under l (see guard.MaxWatchesFor).
func MaxWatchesFor(l MemoryLimit) int { return guard.MaxWatchesFor(l) }

// DefaultMaxWatchesPerIdentity is the cap per caller that
// MaxWatchesPerIdentity 0 stands for: a quarter of maxWatches, at least 1;
// 0 (none) without maxWatches.
func DefaultMaxWatchesPerIdentity(maxWatches int) int {
	return guard.DefaultMaxWatchesPerIdentity(maxWatches)
}

// RuntimeMemory is the default MemoryReader (see guard.RuntimeMemory).
func RuntimeMemory() (inUse, limit uint64) { return guard.RuntimeMemory() }

// DefaultMaxConnections is main's --max-connections (see
// serve.DefaultMaxConnections).
const DefaultMaxConnections = serve.DefaultMaxConnections
