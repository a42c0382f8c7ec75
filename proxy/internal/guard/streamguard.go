package guard

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Guard reasons of the bytes callers' streams hold (see Streams), in
// X-Watchgate-Decision and watchgate_proxy_guard_rejections_total.
const (
	// GuardBufferedBytes: the caller's watches and lists hold its share of
	// the memory mark buffered (an eighth) already; answered 429.
	GuardBufferedBytes = "BufferedBytes"
	// GuardMaxListsPerIdentity: the caller has --max-lists-per-identity
	// lists in flight already; answered 429.
	GuardMaxListsPerIdentity = "MaxListsPerIdentity"
)

// memoryRefuses reports whether memory sample s is above the high-water
// mark and caller is one the mark refuses. With Streams, those are the
// callers holding at least the average of what callers hold (bytes
// buffered, and a watch's memory for each stream open): the one holding
// the most always, a caller holding nothing only when nobody holds
// anything. Without Streams, everyone.
func (g *Guard) memoryRefuses(caller string, s *MemorySample) bool {
	if !s.above(g.highWater) {
		return false
	}
	return g.Streams == nil || g.Streams.aboveAverage(caller)
}

// bufferedShare is the bytes one caller's streams may hold buffered: an
// eighth of the memory high-water mark of s's limit, or
// defaultBufferedBytesPerCaller without one.
func (g *Guard) bufferedShare(s *MemorySample) int64 {
	if s.limit == 0 || g.highWater <= 0 || g.highWater >= 1 {
		return defaultBufferedBytesPerCaller
	}
	return int64(g.highWater*float64(s.limit)) / bufferedShareDivisor
}

// bufferedVerdict is the reason to refuse caller's new watch for the bytes
// its streams hold (GuardBufferedBytes), "" to go on.
func (g *Guard) bufferedVerdict(caller string, s *MemorySample) string {
	if g.Streams == nil {
		return ""
	}
	return g.Streams.bufferedVerdict(caller, false, g.bufferedShare(s))
}

// AdmitList admits a list of caller at now and accounts it (cut: see
// Streams.Open), or returns the reason it cannot: above the memory mark
// for a caller the mark refuses (memoryRefuses), at the caller's share of
// buffered bytes, at its lists in flight. Close the stream when the list
// ends. Without Streams every list is admitted, unaccounted (nil).
func (g *Guard) AdmitList(now time.Time, caller string, cut func()) (*Stream, string, *MemorySample) {
	if g.Streams == nil {
		return nil, "", nil
	}
	s := g.memory.at(now)
	if s.above(g.highWater) {
		g.memory.reclaim(now)
	}
	if g.memoryRefuses(caller, s) {
		return nil, GuardMemoryHighWater, s
	}
	st, reason := g.Streams.openList(caller, g.bufferedShare(s), cut)
	return st, reason, s
}

// openList opens a list of caller unless its bytes are at share or its
// lists at the cap, in one step so that concurrent lists cannot pass the
// cap together.
func (s *Streams) openList(caller string, share int64, cut func()) (*Stream, string) {
	if reason := s.bufferedVerdict(caller, true, share); reason != "" {
		return nil, reason
	}
	st := s.Open(caller, true, cut)
	s.mu.Lock()
	over := s.maxLists > 0 && st.caller.lists > s.maxLists
	s.mu.Unlock()
	if over {
		st.Close()
		return nil, GuardMaxListsPerIdentity
	}
	return st, ""
}

// streamsRefusal is the Status of a refusal for a reason of Streams.
func (g *Guard) streamsRefusal(reason string) *apierrors.StatusError {
	if reason == GuardMaxListsPerIdentity {
		return apierrors.NewTooManyRequests(fmt.Sprintf(
			"watchgate forwards its maximum of %d lists in flight per identity on this replica for you, please try again in %ds",
			g.Streams.maxLists, RetryAfterSeconds), RetryAfterSeconds)
	}
	return apierrors.NewTooManyRequests(fmt.Sprintf(
		"your watches and lists hold your share of watchgate's memory on this replica in data your clients have not read yet, please try again in %ds",
		RetryAfterSeconds), RetryAfterSeconds)
}

// streamsRefusalText is RefusalText for a reason of Streams.
func (g *Guard) streamsRefusalText(reason string) string {
	if reason == GuardMaxListsPerIdentity {
		return fmt.Sprintf("you have --max-lists-per-identity=%d lists in flight", g.Streams.maxLists)
	}
	return fmt.Sprintf("your streams hold an eighth of --memory-high-water-percent=%d of the memory limit in data not read", g.highWaterPercent)
}

// RunSweeps sweeps Streams (Streams.Sweep) every Streams.SweepInterval,
// telling it whether memory is above the high-water mark, until ctx ends.
func (g *Guard) RunSweeps(ctx context.Context) {
	if g.Streams == nil {
		return
	}
	t := time.NewTicker(g.Streams.SweepInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			now := g.Clock.Now()
			g.Streams.Sweep(now, g.memory.at(now).above(g.highWater))
		}
	}
}

// The metrics of Streams (registered with the proxy's).
var (
	streamsOpen = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_streams",
		Help: "Watches and lists this replica forwards whose buffered bytes are accounted to their caller.",
	})

	stalledStreamsCut = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_stalled_streams_cut_total",
		Help: "Watches and lists cut because their client took none of a write for --stalled-stream-timeout, or, above the memory mark, " +
			"because they were stalled and their caller held the most bytes buffered; by kind (watch, list).",
	}, []string{"kind"})
)

// bufferedBytesGauge reports the Streams NewServer built, the one a
// replica has.
var bufferedBytesGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
	Name: "watchgate_proxy_buffered_bytes",
	Help: "Bytes the forwarded watches and lists hold in the proxy that their clients have not read yet (upstream receive buffers, copies being written, partial frames the inspector keeps).",
}, func() float64 {
	if s := currentStreams.Load(); s != nil {
		return float64(s.BufferedBytes())
	}
	return 0
})

func init() {
	ctrlmetrics.Registry.MustRegister(streamsOpen, stalledStreamsCut, bufferedBytesGauge)
}
