package proxy

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

const mib = 1 << 20

func TestGuardVerdict(t *testing.T) {
	for name, tc := range map[string]struct {
		open, max    int64
		inUse, limit uint64
		highWater    float64
		want         string
	}{
		"admits below both marks":                          {open: 10, max: 100, inUse: 300 * mib, limit: 460 * mib, highWater: 0.85},
		"refuses above the high-water mark":                {open: 10, max: 100, inUse: 400 * mib, limit: 460 * mib, highWater: 0.85, want: GuardMemoryHighWater},
		"admits exactly at the high-water mark":            {inUse: 85 * mib, limit: 100 * mib, highWater: 0.85},
		"memory wins when both would refuse":               {open: 100, max: 100, inUse: 99 * mib, limit: 100 * mib, highWater: 0.85, want: GuardMemoryHighWater},
		"refuses at the watch cap":                         {open: 100, max: 100, want: GuardMaxWatches},
		"admits the last watch under the cap":              {open: 99, max: 100},
		"no cap when max is 0":                             {open: 1 << 40},
		"no memory check without a limit (GOMEMLIMIT off)": {inUse: 10 << 30, highWater: 0.85},
		"a high-water mark of 100% never refuses":          {inUse: 2 * mib, limit: mib, highWater: 1},
	} {
		t.Run(name, func(t *testing.T) {
			if got := guardVerdict(tc.open, tc.max, tc.inUse, tc.limit, tc.highWater); got != tc.want {
				t.Errorf("guardVerdict = %q, want %q", got, tc.want)
			}
		})
	}
}

// The memory reader is called at most once per sample interval, however
// many watches open; a new sample is taken once the interval has passed.
func TestGuardSamplesMemory(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(t0)
	var reads atomic.Int32
	var inUse atomic.Uint64
	inUse.Store(10 * mib)
	g := newWatchGuard(0, 85, func() (uint64, uint64) { reads.Add(1); return inUse.Load(), 100 * mib }, clk)

	if r, _ := g.admit(t0); r != "" {
		t.Fatalf("t0: %q, want admitted", r)
	}
	g.release()
	inUse.Store(90 * mib) // over the mark, but not sampled yet
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if r, _ := g.admit(t0.Add(100 * time.Millisecond)); r == "" {
				g.release()
			}
		})
	}
	wg.Wait()
	if n := reads.Load(); n != 1 {
		t.Errorf("%d reads within one interval, want 1", n)
	}
	if r, s := g.admit(t0.Add(memorySampleInterval)); r != GuardMemoryHighWater || s.inUse != 90*mib {
		t.Errorf("after the interval: %q with %d MiB, want %q with 90", r, s.inUse>>20, GuardMemoryHighWater)
	}
	inUse.Store(50 * mib) // the collector caught up
	if r, _ := g.admit(t0.Add(2 * memorySampleInterval)); r != "" {
		t.Errorf("memory back below the mark: %q, want admitted", r)
	}
}

// The cap holds under concurrent opens, and a released place is reused.
func TestGuardCapsWatches(t *testing.T) {
	g := newWatchGuard(5, 85, func() (uint64, uint64) { return 0, 0 }, clocktesting.NewFakePassiveClock(time.Now()))
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if r, _ := g.admit(time.Now()); r == "" {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 5 {
		t.Fatalf("%d of 50 concurrent watches admitted under a cap of 5", n)
	}
	g.release()
	if r, _ := g.admit(time.Now()); r != "" {
		t.Errorf("after one release: %q, want admitted", r)
	}
	if r, _ := g.admit(time.Now()); r != GuardMaxWatches {
		t.Errorf("at the cap again: %q, want %q", r, GuardMaxWatches)
	}
}

// The answers: 503 with Retry-After above the memory mark, 429 with
// Retry-After at the cap, both with the decision header and a Status a
// client can read; lists and other requests pass, open watches are never
// cut, and a finished watch frees its place.
func TestWatchGuardAnswers(t *testing.T) {
	var inUse atomic.Uint64
	inUse.Store(10 * mib)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	g := newWatchGuard(1, 85, func() (uint64, uint64) { return inUse.Load(), 100 * mib }, clk)
	release := make(chan struct{})
	entered := make(chan struct{}, 10)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusOK)
	})
	h := withClassification(newRequestInfoFactory(), discardLogs(), withWatchGuard(g, next))
	do := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}
	const watch = "/api/v1/namespaces/ns/configmaps?watch=true"
	check := func(rec *httptest.ResponseRecorder, code int, reason metav1.StatusReason, header, message string) {
		t.Helper()
		var s metav1.Status
		if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
			t.Fatalf("body %q: %v", rec.Body, err)
		}
		if rec.Code != code || s.Reason != reason || rec.Header().Get("Retry-After") != "5" || s.Details == nil ||
			s.Details.RetryAfterSeconds != 5 || rec.Header().Get(DecisionHeader) != header || !strings.Contains(s.Message, message) {
			t.Errorf("HTTP %d, Retry-After %q, %s %q, Status %+v; want %d %s, 5s, %q, a message with %q",
				rec.Code, rec.Header().Get("Retry-After"), DecisionHeader, rec.Header().Get(DecisionHeader), s, code, reason, header, message)
		}
	}

	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- do(watch) }()
	<-entered // the one watch the cap allows is open
	check(do(watch), http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
		"reject; reason=MaxWatches; retry-after=5", "maximum of 1 watches")
	if rec := do("/api/v1/namespaces/ns/configmaps"); rec.Code != http.StatusOK {
		t.Errorf("a list at the watch cap: HTTP %d, want it forwarded", rec.Code)
	}
	close(release)
	if rec := <-done; rec.Code != http.StatusOK {
		t.Errorf("the open watch ended with HTTP %d", rec.Code)
	}

	inUse.Store(90 * mib)
	clk.SetTime(clk.Now().Add(time.Second))
	check(do(watch), http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
		"reject; reason=MemoryHighWater; retry-after=5", "90 of 100 MiB")
	if rec := do("/version"); rec.Code != http.StatusOK {
		t.Errorf("a non-resource request under memory pressure: HTTP %d, want it forwarded", rec.Code)
	}
	inUse.Store(20 * mib)
	clk.SetTime(clk.Now().Add(time.Second))
	if rec := do(watch); rec.Code != http.StatusOK { // release is closed: the watch ends at once
		t.Errorf("memory back below the mark: HTTP %d, want the watch forwarded", rec.Code)
	}
}

// RuntimeMemory reads the real runtime: some memory in use, and the limit
// set with debug.SetMemoryLimit (GOMEMLIMIT) or none.
func TestRuntimeMemory(t *testing.T) {
	inUse, limit := RuntimeMemory()
	if inUse < mib || inUse > 1<<40 {
		t.Errorf("in use %d bytes: not a plausible reading", inUse)
	}
	if limit == math.MaxInt64 {
		t.Errorf("limit %d: an unset limit must read as 0", limit)
	}
}
