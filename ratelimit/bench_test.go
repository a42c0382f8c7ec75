package ratelimit

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watchgate/watchgate/internal/cputime"
)

// benchPolicy is a realistic policy: an exempt budget, one for controllers
// and a default one with every limit set, which governs the benchmarks'
// requests (so they walk past two budgets to match).
func benchPolicy(tb testing.TB) *Policy {
	return mustPolicy(tb,
		Budget{Name: "system-masters", Precedence: 1, Enforcement: Exempt, Subjects: []Subject{{Kind: Group, Name: "system:masters"}}},
		Budget{Name: "controllers", Precedence: 10, Subjects: []Subject{{Kind: ServiceAccount, Namespace: "kube-system", Name: "*"}},
			Limits: Limits{WatchOpensPerMinute: 600, WatchBurst: 100}},
		Budget{
			Name: "default", Precedence: 100,
			Limits:        Limits{WatchOpensPerMinute: 6000, WatchBurst: 100, MaxConcurrentWatches: 50, InitialStateCost: 5, ListsPerMinute: 6000, ListBurst: 100},
			Backoff:       Backoff{Initial: time.Second, Max: 5 * time.Minute, ShortWatch: time.Second, ResetAfter: 5 * time.Minute},
			StaleVersions: StaleVersions{Memory: 5 * time.Minute},
		},
	)
}

func benchRequest(user string, verb Verb) Request {
	return Request{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"},
		Verb:   verb, Resource: "pods", Namespace: "team-a",
		LabelSelector: "app=agent", ResourceVersion: "123456",
	}
}

func benchEngine(tb testing.TB) *Engine {
	e := NewEngine(Options{Seed: 1})
	e.SetPolicy(t0, benchPolicy(tb))
	e.StaleVersionSeen(t0, "", "pods", "99") // so stale lookups are not skipped
	return e
}

// BenchmarkDecide measures the allow path for a known identity: a watch
// admitted and released (10ms apart, so the bucket refills as fast as it
// drains), and a list.
func BenchmarkDecide(b *testing.B) {
	for _, verb := range []Verb{VerbWatch, VerbList} {
		name := map[Verb]string{VerbWatch: "watch", VerbList: "list"}[verb]
		b.Run(name, func(b *testing.B) {
			e := benchEngine(b)
			r := benchRequest("system:serviceaccount:team-a:agent", verb)
			now := t0
			e.Decide(now, &r)
			b.ReportAllocs()
			cpu := cputime.Process()
			for b.Loop() {
				now = now.Add(10 * time.Millisecond)
				d := e.Decide(now, &r)
				if !d.Allowed {
					b.Fatalf("rejected: %+v", d)
				}
				e.WatchEnded(now, d.Watch, 10*time.Minute, OutcomeClosed)
			}
			reportCPU(b, cpu)
		})
	}
}

// BenchmarkDecideParallel is BenchmarkDecide/watch with one identity per
// goroutine, to show that identities do not wait for each other. Run with
// -cpu 1,2,...: ns/op should fall, not rise, with more CPUs.
func BenchmarkDecideParallel(b *testing.B) {
	e := benchEngine(b)
	var next atomic.Int64
	b.ReportAllocs()
	cpu := cputime.Process()
	defer reportCPU(b, cpu)
	b.RunParallel(func(pb *testing.PB) {
		r := benchRequest(fmt.Sprint("system:serviceaccount:team-a:agent-", next.Add(1)), VerbWatch)
		now := t0
		for pb.Next() {
			now = now.Add(10 * time.Millisecond)
			d := e.Decide(now, &r)
			if !d.Allowed {
				b.Errorf("rejected: %+v", d)
				return
			}
			e.WatchEnded(now, d.Watch, 10*time.Minute, OutcomeClosed)
		}
	})
}

// BenchmarkIdentityMemory reports the heap held per tracked identity, over
// 100,000 identities that each opened and closed a watch and made a list
// under the default budget (watch and list buckets). The user names are
// made beforehand, but the engine keeps its own copies, which count.
func BenchmarkIdentityMemory(b *testing.B) {
	const n = 100_000
	users := make([]string, n)
	for i := range users {
		users[i] = fmt.Sprintf("system:serviceaccount:team-%d:agent", i)
	}
	var perIdentity float64
	for b.Loop() {
		e := benchEngine(b)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for _, u := range users {
			r := benchRequest(u, VerbWatch)
			d := e.Decide(t0, &r)
			e.WatchEnded(t0, d.Watch, 10*time.Minute, OutcomeClosed)
			r.Verb = VerbList
			e.Decide(t0, &r)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := e.Stats()["default"].TrackedIdentities; got != n {
			b.Fatalf("tracking %d identities, want %d", got, n)
		}
		perIdentity = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(e)
	}
	b.ReportMetric(perIdentity, "B/identity")
}

// reportCPU reports the CPU time used since cpu per op, as cpu-ns/op.
func reportCPU(b *testing.B, cpu time.Duration) {
	if cpu == 0 || b.N == 0 {
		return
	}
	b.ReportMetric(float64(cputime.Process()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkBackoffKeyMemory reports the heap held per backoff key, over
// 100,000 distinct keys: 1,563 identities that each failed watches on 64
// keys (their cap, Options.MaxBackoffKeysPerIdentity), every key with a
// 4 KiB label selector, which the engine must not keep. The identities
// exist before the first measurement, so only the keys count.
func BenchmarkBackoffKeyMemory(b *testing.B) {
	const n = 100_000
	per := defaultMaxBackoffKeysPerIdentity
	users := make([]string, (n+per-1)/per)
	for i := range users {
		users[i] = fmt.Sprintf("system:serviceaccount:team-%d:agent", i)
	}
	pad := strings.Repeat("x", 4<<10)
	var perKey float64
	for b.Loop() {
		e := benchEngine(b)
		for _, u := range users {
			r := benchRequest(u, VerbList)
			e.Decide(t0, &r)
		}
		before := heapInUse()
		for i := range n {
			r := benchRequest(users[i/per], VerbWatch)
			r.LabelSelector = fmt.Sprint("run=", i, ",pad=", pad)
			d := e.Decide(t0, &r)
			if !d.Allowed {
				b.Fatalf("key %d: %+v", i, d)
			}
			e.WatchEnded(t0, d.Watch, 0, OutcomeError)
		}
		after := heapInUse()
		if got := e.backoffKeys.count(); got != n {
			b.Fatalf("tracking %d backoff keys, want %d", got, n)
		}
		perKey = float64(after-before) / n
		runtime.KeepAlive(e)
	}
	b.ReportMetric(perKey, "B/key")
}

// BenchmarkStaleVersionMemory reports the heap held per remembered stale
// version at the cap (maxStaleVersions, over 16 resources), each reported
// as a 1 KiB string of leading zeros and digits, which the engine must not
// keep.
func BenchmarkStaleVersionMemory(b *testing.B) {
	zeros := strings.Repeat("0", 1<<10)
	var perVersion float64
	for b.Loop() {
		e := NewEngine(Options{})
		before := heapInUse()
		for i := range maxStaleVersions {
			e.StaleVersionSeen(t0, "", fmt.Sprint("resource-", i%16), zeros+fmt.Sprint(i+1))
		}
		after := heapInUse()
		if got := e.stale.versions.count(); got != maxStaleVersions {
			b.Fatalf("remembering %d versions, want %d", got, maxStaleVersions)
		}
		perVersion = float64(after-before) / maxStaleVersions
		runtime.KeepAlive(e)
	}
	b.ReportMetric(perVersion, "B/version")
}
