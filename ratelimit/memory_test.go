package ratelimit

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// heapInUse is the live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// Issue 9 finding 1: one identity failing watches on ever new keys must
// neither take other identities' places nor push them into the shared
// overflow identity, and must stay throttled itself.
func TestOneIdentityFailingOnManyKeysLeavesOthersTheirOwnBuckets(t *testing.T) {
	b := Budget{
		Name:    "keys",
		Limits:  Limits{WatchOpensPerMinute: 60, WatchBurst: 50, MaxConcurrentWatches: 50},
		Backoff: Backoff{Initial: s, Max: 5 * time.Minute, ShortWatch: s},
	}
	e := newTestEngine(t, Options{MaxTrackedKeys: 100}, b)
	attacker := func(i int) *Request {
		r := watch()
		r.User = "attacker"
		r.LabelSelector = fmt.Sprint("run=", i)
		return r
	}
	for i := range 600 {
		now := t0.Add(time.Duration(i) * s)
		if d := e.Decide(now, attacker(i)); d.Allowed {
			e.WatchEnded(now, d.Watch, 0, OutcomeError)
		}
	}
	end := t0.Add(600 * s)
	for u := range 10 {
		for i := range 50 {
			r := watchIn(fmt.Sprint("ns-", i))
			r.User = fmt.Sprint("user-", u)
			if d := e.Decide(end, r); !d.Allowed {
				t.Fatalf("user-%d's watch %d of 50: %s %s", u, i, d.Reason, d.RetryAfter)
			}
		}
	}
	if got := e.Stats()["keys"].TrackedIdentities; got != 11 {
		t.Errorf("TrackedIdentities = %d, want 11: each user tracked on its own", got)
	}
	// The attacker's further failing keys back off together.
	if d := e.Decide(end, attacker(601)); d.Reason != ReasonBackingOff {
		t.Errorf("the attacker's 601st key: %+v, want it backing off", d)
	}
}

// Issue 9 finding 1: failing watches with huge selectors, and stale
// reports of huge versions, keep nothing of the client's strings; a DryRun
// budget, which learns backoff too, no more than an enforced one.
func TestHugeSelectorsAndVersionsLeaveTheHeapFlat(t *testing.T) {
	for _, mode := range []Enforcement{Enforce, DryRun} {
		t.Run(string(mode), func(t *testing.T) { testHugeKeys(t, mode) })
	}
}

func testHugeKeys(t *testing.T, mode Enforcement) {
	e := newTestEngine(t, Options{}, Budget{
		Name:          "huge",
		Enforcement:   mode,
		Backoff:       Backoff{Initial: s, Max: 5 * time.Minute, ShortWatch: s},
		StaleVersions: StaleVersions{Memory: time.Hour},
	})
	huge := strings.Repeat("x", 900<<10)
	before := heapInUse()
	for i := range 600 {
		r := watch()
		r.User = fmt.Sprint("client-", i%6)
		r.LabelSelector = huge + fmt.Sprint(i)
		r.FieldSelector = fmt.Sprint(i) + huge
		// Each client fails on 100 keys: 64 of its own, and the rest
		// shared in its overflow key, which then backs off.
		if d := e.Decide(t0, r); d.Allowed {
			e.WatchEnded(t0, d.Watch, 0, OutcomeError)
		}
	}
	zeros := strings.Repeat("0", 1<<20)
	for i := range 60 {
		e.StaleVersionSeen(t0, "", "pods", zeros+fmt.Sprint(i+1))
	}
	after := heapInUse()
	if diff := after - before; diff > 5<<20 || diff < -5<<20 {
		t.Errorf("heap moved by %.1f MiB after 600 failing watches with 900 KiB selectors and 60 1 MiB versions, want within ±5 MiB",
			float64(diff)/(1<<20))
	}
	if got, want := e.backoffKeys.count(), int64(6*defaultMaxBackoffKeysPerIdentity); got != want {
		t.Errorf("tracking %d backoff keys, want %d (six clients at their cap)", got, want)
	}
	// What was learned still works: the versions were read as numbers,
	// and each client backs off.
	if d := e.Decide(t0, watchFrom("7")); d.Reason != ReasonStaleResourceVersion {
		t.Errorf("rv 7 (reported as %d zeros then 7): %+v, want stale", len(zeros), d)
	}
	r := watch()
	r.User, r.LabelSelector, r.FieldSelector = "client-0", huge+"0", "0"+huge
	if d := e.Decide(t0, r); d.Reason != ReasonBackingOff || d.DryRun != (mode == DryRun) {
		t.Errorf("client-0's first key: %+v, want it backing off", d)
	}
	runtime.KeepAlive(e)
}

// At the engine-wide cap of backoff keys a failing key still backs off, in
// its own identity's overflow key, and touches no other identity.
func TestBackoffKeysBeyondTheEngineCapBackOffPerIdentity(t *testing.T) {
	e := newTestEngine(t, Options{MaxBackoffKeys: 2}, Budget{
		Name:    "b",
		Backoff: Backoff{Initial: s, Max: time.Minute, ShortWatch: s},
	})
	by := func(user, ns string) *Request { r := watchIn(ns); r.User = user; return r }
	for _, u := range []string{"a", "b", "c"} {
		e.WatchEnded(t0, e.Decide(t0, by(u, "x")).Watch, 0, OutcomeError)
	}
	if got := e.backoffKeys.count(); got != 2 {
		t.Fatalf("tracking %d backoff keys, want the cap, 2", got)
	}
	expect(t, "a's key", e.Decide(t0, by("a", "x")), false, ReasonBackingOff, s)
	expect(t, "c's key, in c's overflow key", e.Decide(t0, by("c", "x")), false, ReasonBackingOff, s)
	// c's overflow key governs c's untracked keys, nobody else's.
	expect(t, "c elsewhere", e.Decide(t0, by("c", "y")), false, ReasonBackingOff, s)
	expect(t, "a elsewhere", e.Decide(t0, by("a", "y")), true, "", 0)
	expect(t, "d", e.Decide(t0, by("d", "x")), true, "", 0)
	// Sweep frees them all, and the count with them.
	e.Sweep(t0.Add(time.Hour))
	if got := e.backoffKeys.count(); got != 0 {
		t.Errorf("%d backoff keys after Sweep", got)
	}
}

// Identities with huge user names (an agent may impersonate any name)
// keep a bounded key, and are still told apart.
func TestHugeUserNamesAreKeptBounded(t *testing.T) {
	e := newTestEngine(t, Options{}, Budget{Name: "b", Limits: Limits{WatchOpensPerMinute: 60, WatchBurst: 1}})
	huge := strings.Repeat("u", 1<<20)
	before := heapInUse()
	for i := range 100 {
		r := watch()
		r.User = huge + fmt.Sprint(i)
		expect(t, fmt.Sprint("user ", i), e.Decide(t0, r), true, "", 0)
	}
	after := heapInUse()
	if diff := after - before; diff > 1<<20 {
		t.Errorf("heap grew by %.1f MiB for 100 identities with 1 MiB names, want < 1 MiB", float64(diff)/(1<<20))
	}
	r := watch()
	r.User = huge + "7"
	expect(t, "user 7 again: its own bucket, empty", e.Decide(t0, r), false, ReasonRateLimited, s)
	if got := e.Stats()["b"].TrackedIdentities; got != 100 {
		t.Errorf("TrackedIdentities = %d, want 100", got)
	}
	top := e.Stats()["b"].TopOffenders
	if len(top) != 1 {
		t.Fatalf("%d top offenders, want 1", len(top))
	}
	if u := top[0].User; len(u) > maxUserBytes || !strings.HasPrefix(u, "uuu") {
		t.Errorf("top offender kept as %d bytes starting %.8q", len(u), u)
	}
	runtime.KeepAlive(e)
}

// Stale reports that could not come from an API server — names longer than
// an API group or resource can be, versions that do not parse — are not
// remembered at all.
func TestImpossibleStaleReportsAreNotRemembered(t *testing.T) {
	e := newTestEngine(t, Options{}, Budget{Name: "b", StaleVersions: StaleVersions{Memory: time.Hour}})
	long := strings.Repeat("g", 1<<20)
	e.StaleVersionSeen(t0, long, "pods", "42")
	e.StaleVersionSeen(t0, "", long, "42")
	for _, rv := range []string{"", "0", "000", "-1", "1e3", "18446744073709551616", strings.Repeat("9", 1<<20)} {
		e.StaleVersionSeen(t0, "", "pods", rv)
	}
	if v, r := e.stale.versions.count(), e.stale.resources.count(); v != 0 || r != 0 {
		t.Errorf("remembering %d versions of %d resources, want none", v, r)
	}
	expect(t, "a watch from 42", e.Decide(t0, watchFrom("42")), true, "", 0)
}
