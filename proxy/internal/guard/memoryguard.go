package guard

import (
	"math"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

const (
	// DefaultMemoryHighWaterPercent is the default of
	// Options.MemoryHighWaterPercent: new watches are refused once the Go
	// runtime's memory in use passes 85% of its memory limit (GOMEMLIMIT).
	DefaultMemoryHighWaterPercent = 85
	// memorySampleInterval is how often the guard reads the runtime's
	// memory; between samples a watch open costs two atomic loads.
	memorySampleInterval = 250 * time.Millisecond
	// memoryCollectInterval is how often, at most, the guard has the
	// runtime collect garbage because memory in use passed the high-water
	// mark (memorySampler.reclaim).
	memoryCollectInterval = 10 * time.Second
)

// MemoryReader returns the memory the process uses and the limit it must
// stay within, in bytes; limit 0 or math.MaxUint64 means none.
type MemoryReader func() (inUse, limit uint64)

// RuntimeMemory is the default MemoryReader: the memory the Go runtime
// holds that its collector cannot free, against /gc/gomemlimit:bytes
// (GOMEMLIMIT or debug.SetMemoryLimit; math.MaxInt64 when unset).
//
// That is every byte the runtime has mapped (/memory/classes/total:bytes)
// except heap memory returned to the OS (heap/released), free heap spans
// it keeps for reuse (heap/free), and heap objects beyond those the last
// collection found live (heap/objects − /gc/heap/live:bytes): the garbage
// of watches that opened and closed, and whatever was allocated since. So
// goroutine stacks, the runtime's metadata and the heap's fragmentation
// count as they are now, and the heap as the last collection left it.
//
// Under GOMEMLIMIT the collector runs as the process nears the limit, as
// often as it must, and frees the garbage: counting garbage would refuse
// watches whenever the collector has not yet run (above half the limit,
// the collector lets garbage grow until the limit). What was allocated
// since the last collection counts at the next one, which comes before the
// limit: watches opened at once can pass the mark by what one collection
// cycle admits, within the limit. It costs
// about a microsecond; the guard calls it at most every 250ms.
func RuntimeMemory() (inUse, limit uint64) {
	s := [6]metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/gc/heap/live:bytes"},
		{Name: "/gc/gomemlimit:bytes"},
	}
	metrics.Read(s[:])
	for _, v := range s {
		if v.Value.Kind() != metrics.KindUint64 {
			return 0, 0 // unknown to this runtime: no memory check
		}
	}
	total, released, free := s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64()
	objects, live, lim := s[3].Value.Uint64(), s[4].Value.Uint64(), s[5].Value.Uint64()
	if lim >= math.MaxInt64 {
		lim = 0
	}
	collectable := released + free
	if objects > live {
		collectable += objects - live
	}
	return total - min(collectable, total), lim
}

// MemorySample is one reading and when it was taken.
type MemorySample struct {
	at           time.Time
	inUse, limit uint64
}

// memorySampler reads the process's memory at most every
// memorySampleInterval: between samples a reading costs an atomic load. It
// is safe for concurrent use.
type memorySampler struct {
	read   MemoryReader
	every  time.Duration
	sample atomic.Pointer[MemorySample]
	// sampling is held by the one caller refreshing the sample.
	sampling sync.Mutex

	// collect collects garbage (runtime.GC), at most every collectEvery:
	// collecting is set while it runs, collectedAt is the last start.
	collect      func()
	collectEvery time.Duration
	collecting   atomic.Bool
	collectedAt  atomic.Int64
}

func newMemorySampler(read MemoryReader) *memorySampler {
	if read == nil {
		read = RuntimeMemory
	}
	m := &memorySampler{read: read, every: memorySampleInterval, collect: runtime.GC, collectEvery: memoryCollectInterval}
	m.sample.Store(&MemorySample{})
	return m
}

// reclaim has the runtime collect garbage in the background, unless it
// did less than collectEvery before now or is collecting now, and then
// has the next sample taken at once. The guard calls it when memory in use
// has passed the high-water mark: RuntimeMemory counts the heap as the
// last collection left it, which may be stale by the watches that closed
// since. The caller that triggered it is refused all the same (Retry-After
// 5 s); nobody waits for the collection.
func (m *memorySampler) reclaim(now time.Time) {
	if last := m.collectedAt.Load(); last != 0 && now.Sub(time.Unix(0, last)) < m.collectEvery {
		return
	}
	if !m.collecting.CompareAndSwap(false, true) {
		return
	}
	m.collectedAt.Store(now.UnixNano())
	memoryCollections.Inc()
	go func() {
		defer m.collecting.Store(false)
		m.collect()
		m.sample.Store(&MemorySample{}) // stale: the next call reads anew
	}()
}

// at returns a sample at most m.every old at now, refreshing it when it is
// older and no other caller is refreshing it already.
func (m *memorySampler) at(now time.Time) *MemorySample {
	s := m.sample.Load()
	if now.Sub(s.at) < m.every || !m.sampling.TryLock() {
		return s
	}
	defer m.sampling.Unlock()
	inUse, limit := m.read()
	s = &MemorySample{at: now, inUse: inUse, limit: limit}
	m.sample.Store(s)
	memoryInUseBytes.Set(float64(inUse))
	memoryLimitBytes.Set(float64(limit))
	return s
}

// above reports whether the sample is above fraction of its limit; never
// without a limit or for a fraction of 0, or 1 and more.
func (s *MemorySample) above(fraction float64) bool {
	return fraction > 0 && fraction < 1 && s.limit > 0 && float64(s.inUse) > fraction*float64(s.limit)
}

// The memory sampler's metrics (registered with the proxy's).
var (
	memoryInUseBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_memory_in_use_bytes",
		Help: "Memory the Go runtime holds that its collector cannot free (the heap live at the last collection, stacks, metadata), as the watch guard last sampled it.",
	})

	memoryLimitBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watchgate_proxy_memory_limit_bytes",
		Help: "The Go runtime's memory limit (GOMEMLIMIT) as the watch guard last sampled it; 0 when none is set.",
	})

	memoryCollections = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "watchgate_proxy_memory_collections_total",
		Help: "Garbage collections the watch guard started because memory in use passed the high-water mark (at most one every 10s).",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(memoryInUseBytes, memoryLimitBytes, memoryCollections)
}
