package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/admit"
	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/callertest"
	"github.com/watchgate/watchgate/proxy/internal/coalesce"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/proxy/internal/metricstest"
	"github.com/watchgate/watchgate/ratelimit"
)

func noMemory() (uint64, uint64) { return 0, 0 }

// With the chart's defaults (the cap derived from GOMEMLIMIT 460 MiB, 90%
// of its 512Mi, and a catch-all DryRun budget that refuses nothing) one
// caller cannot take a replica: its own ceiling stops it at a quarter, and
// another caller still gets in.
func TestTheDefaultsKeepOneCallerFromTakingTheReplica(t *testing.T) {
	chartCap := guard.MaxWatchesFor(guard.MemoryLimit{Source: guard.MemoryLimitFromGoMemLimit, Bytes: 460 << 20, GoMemLimit: 460 << 20})
	o := Options{MaxWatches: chartCap}.complete()
	g := guard.New(o.MaxWatches, o.MaxWatchesPerIdentity, o.MemoryHighWaterPercent, noMemory, clocktesting.NewFakePassiveClock(time.Now()))
	n, reason := 0, ""
	for ; n <= chartCap; n++ {
		if reason, _ = g.Admit(time.Now(), "mallory"); reason != "" {
			break
		}
	}
	if reason != guard.GuardMaxWatchesPerIdentity || n != chartCap/4 {
		t.Errorf("one caller opened %d watches, then %q; want %d, then %q", n, reason, chartCap/4, guard.GuardMaxWatchesPerIdentity)
	}
	if r, _ := g.Admit(time.Now(), "alice"); r != "" {
		t.Errorf("another caller after that: %q, want admitted", r)
	}
}

// guardedUpstream answers every watch 200 and ends it, except watches from
// resourceVersion 5, which it holds without an answer until release closes.
func guardedUpstream(t *testing.T, release <-chan struct{}) *rest.Config {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("resourceVersion") == "5" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(up.Close)
	return &rest.Config{Host: up.URL}
}

// holdPath opens a watch of path with token in the background; with
// guardedUpstream it stays open until release closes.
func holdPath(t *testing.T, px *httptest.Server, token, path string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, px.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	go func() {
		if resp, err := px.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
}

// waitFor waits, at most 5s, until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Watches their budget rejects wait out the rejection's delay without a
// place of the replica's guard: another caller's first watch gets in. (It
// got 429 MaxWatches when the guard came before the budget.)
func TestARejectedWatchHoldsNoGuardPlace(t *testing.T) {
	engine := &enginetest.Engine{DecideFunc: func(r *ratelimit.Request) ratelimit.Decision {
		if r.User == callertest.Alice.Name {
			return ratelimit.Decision{Reason: ratelimit.ReasonTooManyWatches, RetryAfter: 2 * time.Second, Budget: "tenants"}
		}
		return ratelimit.Decision{Allowed: true}
	}}
	px := newTestAdmission(t, &admit.Admission{Engine: engine, MaxDelay: 2 * time.Second,
		Guard: guard.New(2, 0, 85, noMemory, clocktesting.NewFakePassiveClock(time.Now()))}, guardedUpstream(t, nil))
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 4 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, px.URL+"/api/v1/namespaces/a/pods?watch=true", nil)
			req.Header.Set("Authorization", "Bearer alice")
			if resp, err := px.Client().Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	waitFor(t, "alice's watches to be waiting", func() bool { reqs, _, _ := engine.Snapshot(); return len(reqs) >= 2 })
	resp, body := get(t, px, "agent", "/api/v1/namespaces/b/pods?watch=true")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the agent's watch while alice's rejected watches wait: HTTP %d %s (%s), want 200",
			resp.StatusCode, resp.Header.Get(answer.DecisionHeader), body)
	}
	cancel()
}

// Followers waiting for their leader's verdict hold no guard place; only
// the leader, which is forwarded, does.
func TestAFollowerHoldsNoGuardPlace(t *testing.T) {
	release := make(chan struct{})
	px := newTestAdmission(t, &admit.Admission{Engine: &enginetest.Engine{}, MaxDelay: 50 * time.Millisecond,
		Guard: guard.New(2, 0, 85, noMemory, clocktesting.NewFakePassiveClock(time.Now()))}, guardedUpstream(t, release))
	before := metricstest.CounterValue(t, coalesce.WatchesCoalesced)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	for range 4 {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, px.URL+"/api/v1/namespaces/a/pods?watch=true&resourceVersion=5", nil)
			req.Header.Set("Authorization", "Bearer alice")
			if resp, err := px.Client().Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	// The leader is open upstream; the followers (one when they took guard
	// places first) wait.
	waitFor(t, "followers", func() bool { return metricstest.CounterValue(t, coalesce.WatchesCoalesced) > before })
	time.Sleep(50 * time.Millisecond) // let any other follower reach the guard
	resp, body := get(t, px, "agent", "/api/v1/namespaces/b/pods?watch=true")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the agent's watch while alice's followers wait: HTTP %d %s (%s), want 200",
			resp.StatusCode, resp.Header.Get(answer.DecisionHeader), body)
	}
}

// The guard's answers: 503 with Retry-After above the memory mark, 429
// with Retry-After at the cap, at the caller's ceiling and beyond its fair
// share, each with the decision header and a Status a client can read;
// lists pass, and a refused watch gives its budget slot back without
// counting as a failure.
func TestWatchGuardAnswers(t *testing.T) {
	var inUse atomic.Uint64
	inUse.Store(10 * mib)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	release := make(chan struct{})
	defer close(release)
	engine := &enginetest.Engine{}
	g := guard.New(4, 2, 85, func() (uint64, uint64) { return inUse.Load(), 100 * mib }, clk)
	px := newTestAdmission(t, &admit.Admission{Engine: engine, MaxDelay: 50 * time.Millisecond, Guard: g}, guardedUpstream(t, release))
	check := func(token, path string, code int, reason metav1.StatusReason, header, message string) {
		t.Helper()
		resp, body := get(t, px, token, path)
		var s metav1.Status
		if err := json.Unmarshal(body, &s); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		if resp.StatusCode != code || s.Reason != reason || resp.Header.Get("Retry-After") != "5" || s.Details == nil ||
			s.Details.RetryAfterSeconds != 5 || resp.Header.Get(answer.DecisionHeader) != header || !strings.Contains(s.Message, message) {
			t.Errorf("HTTP %d, Retry-After %q, %s %q, Status %+v; want %d %s, 5s, %q, a message with %q",
				resp.StatusCode, resp.Header.Get("Retry-After"), answer.DecisionHeader, resp.Header.Get(answer.DecisionHeader), s, code, reason, header, message)
		}
	}
	// Watches of different groups, so that none follows another.
	holdPath(t, px, "alice", "/api/v1/namespaces/a/pods?watch=true&resourceVersion=5")
	waitFor(t, "alice's first watch", func() bool { return g.OpenCount() == 1 })
	holdPath(t, px, "alice", "/apis/one.example/v1/things?watch=true&resourceVersion=5")
	holdPath(t, px, "agent", "/apis/two.example/v1/things?watch=true&resourceVersion=5")
	waitFor(t, "three watches", func() bool { return g.OpenCount() == 3 })
	check("alice", "/api/v1/namespaces/a/configmaps?watch=true", http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
		"reject; reason=MaxWatchesPerIdentity; retry-after=5", "maximum of 2 watches per identity")
	holdPath(t, px, "agent", "/apis/three.example/v1/things?watch=true&resourceVersion=5")
	waitFor(t, "four watches", func() bool { return g.OpenCount() == 4 })
	check("agent", "/api/v1/namespaces/a/configmaps?watch=true", http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
		"reject; reason=MaxWatches; retry-after=5", "maximum of 4 watches")
	if resp, _ := get(t, px, "agent", "/api/v1/namespaces/a/configmaps"); resp.StatusCode != http.StatusOK {
		t.Errorf("a list at the watch cap: HTTP %d, want it forwarded", resp.StatusCode)
	}

	inUse.Store(90 * mib)
	clk.SetTime(clk.Now().Add(time.Second))
	check("agent", "/api/v1/namespaces/a/configmaps?watch=true", http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
		"reject; reason=MemoryHighWater; retry-after=5", "90 of 100 MiB")
	// Every refused watch gave back the slot its budget gave it, without
	// counting as a failed watch.
	_, ended, _ := engine.Snapshot()
	if len(ended) != 3 {
		t.Fatalf("%d watches ended, want the 3 refused", len(ended))
	}
	for _, o := range ended {
		if o != ratelimit.OutcomeNotForwarded {
			t.Errorf("a refused watch ended %v, want OutcomeNotForwarded", o)
		}
	}
}

// Near the memory mark a caller above the mean of what is open waits,
// with 429 FairShare.
func TestWatchGuardFairShareAnswer(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	var inUse atomic.Uint64
	inUse.Store(10 * mib)
	g := guard.New(0, 0, 85, func() (uint64, uint64) { return inUse.Load(), 100 * mib }, clk)
	px := newTestAdmission(t, &admit.Admission{Engine: &enginetest.Engine{}, MaxDelay: 50 * time.Millisecond, Guard: g}, guardedUpstream(t, release))
	holdPath(t, px, "alice", "/api/v1/namespaces/a/pods?watch=true&resourceVersion=5")
	waitFor(t, "alice's watch", func() bool { return g.OpenCount() == 1 })
	inUse.Store(80 * mib) // above 90% of the 85% mark
	clk.SetTime(clk.Now().Add(time.Second))
	resp, body := get(t, px, "alice", "/api/v1/namespaces/a/configmaps?watch=true")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get(answer.DecisionHeader) != "reject; reason=FairShare; retry-after=5" ||
		resp.Header.Get("Retry-After") != "5" || !strings.Contains(string(body), "fair share") {
		t.Errorf("alice near the memory mark: HTTP %d %q %s", resp.StatusCode, resp.Header.Get(answer.DecisionHeader), body)
	}
	if resp, _ := get(t, px, "agent", "/api/v1/namespaces/a/configmaps?watch=true"); resp.StatusCode != http.StatusOK {
		t.Errorf("the agent near the memory mark: HTTP %d, want 200", resp.StatusCode)
	}
}

// One caller's burst of watch opens is refused once its bucket is empty,
// with 429 WatchOpenRate and the wait until its next open, while another
// caller's first watch goes through. Watches it opens as an impersonated
// user are charged to it; watches answered locally are not charged; a
// refused watch gives back its guard place and its budget slot.
func TestWatchOpenRateRefusesOneCallersBurstOnly(t *testing.T) {
	engine := &enginetest.Engine{DecideFunc: func(r *ratelimit.Request) ratelimit.Decision {
		if r.ResourceVersion == "1" {
			return ratelimit.Decision{Reason: ratelimit.ReasonStaleResourceVersion, Budget: "tenants"}
		}
		return ratelimit.Decision{Allowed: true}
	}}
	g := guard.New(10, 0, 85, noMemory, clocktesting.NewFakePassiveClock(time.Now()))
	// 3 at once, then one per 100 s: nothing refills while the test runs.
	px := newTestAdmission(t, &admit.Admission{Engine: engine, MaxDelay: time.Millisecond, Guard: g,
		Opens: admit.NewWatchOpenRate(0.01, 3), Warnings: admit.NewWarningLimiter(admit.WarningInterval, admit.MaxWarnedIdentities)}, guardedUpstream(t, nil))
	for i := range 5 {
		if resp, _ := get(t, px, "agent", "/api/v1/namespaces/a/pods?watch=true&resourceVersion=1"); resp.StatusCode != http.StatusOK ||
			!strings.Contains(resp.Header.Get(answer.DecisionHeader), "StaleResourceVersion") {
			t.Fatalf("stale watch %d: HTTP %d %q, want answered locally", i+1, resp.StatusCode, resp.Header.Get(answer.DecisionHeader))
		}
	}
	for i, impersonate := range []string{"", "", "bob"} {
		var headers []string
		if impersonate != "" {
			headers = []string{"Impersonate-User", impersonate}
		}
		if resp, body := get(t, px, "agent", "/api/v1/namespaces/a/pods?watch=true", headers...); resp.StatusCode != http.StatusOK {
			t.Fatalf("the agent's watch %d of its burst of 3: HTTP %d %q %s", i+1, resp.StatusCode, resp.Header.Get(answer.DecisionHeader), body)
		}
	}
	before := metricstest.CounterValue(t, guard.Rejections.WithLabelValues(admit.GuardWatchOpenRate))
	// Not as bob again: bob's own bucket (a quarter of the agent's) is
	// empty after his one open. The agent may not impersonate carol, so
	// this watch is its own, and the agent's bucket is what refuses.
	resp, body := get(t, px, "agent", "/api/v1/namespaces/b/pods?watch=true", "Impersonate-User", "carol")
	var s metav1.Status
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || s.Reason != metav1.StatusReasonTooManyRequests || retry < 90 || retry > 100 ||
		s.Details == nil || int(s.Details.RetryAfterSeconds) != retry ||
		resp.Header.Get(answer.DecisionHeader) != fmt.Sprintf("reject; reason=WatchOpenRate; retry-after=%d", retry) {
		t.Errorf("the agent's 4th watch, as carol: HTTP %d, Retry-After %q, %q, Status %+v; want 429 WatchOpenRate, about 100s",
			resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get(answer.DecisionHeader), s)
	}
	if w := resp.Header.Get("Warning"); !strings.Contains(w, "WatchOpenRate") || !strings.Contains(w, "--watch-open-burst-per-identity=3") {
		t.Errorf("the agent's 4th watch carries Warning %q, want one naming WatchOpenRate and --watch-open-burst-per-identity=3", w)
	}
	if n := metricstest.CounterValue(t, guard.Rejections.WithLabelValues(admit.GuardWatchOpenRate)) - before; n != 1 {
		t.Errorf("watchgate_proxy_guard_rejections_total{reason=WatchOpenRate} grew by %v, want 1", n)
	}
	if resp, body := get(t, px, "alice", "/api/v1/namespaces/a/pods?watch=true"); resp.StatusCode != http.StatusOK {
		t.Errorf("alice's first watch while the agent's bucket is empty: HTTP %d %q %s, want 200", resp.StatusCode, resp.Header.Get(answer.DecisionHeader), body)
	}
	waitFor(t, "every guard place back", func() bool { return g.OpenCount() == 0 })
	_, ended, _ := engine.Snapshot()
	if n := countOutcome(ended, ratelimit.OutcomeNotForwarded); n != 1 {
		t.Errorf("%d watches ended not forwarded, want the refused one", n)
	}
}

func countOutcome(ended []ratelimit.Outcome, o ratelimit.Outcome) (n int) {
	for _, e := range ended {
		if e == o {
			n++
		}
	}
	return n
}

// A WatchOpenRate refusal's Retry-After is the bucket's wait rounded up to
// whole seconds, at least 1.
func TestWatchOpenRateRetryAfterRoundsUp(t *testing.T) {
	o := admit.NewWatchOpenRate(30, 1)
	for wait, want := range map[time.Duration]string{time.Nanosecond: "1", 33 * time.Millisecond: "1", time.Second: "1", 1500 * time.Millisecond: "2"} {
		w := httptest.NewRecorder()
		o.Refuse(w, httptest.NewRequest(http.MethodGet, "/api/v1/pods?watch=true", nil), wait)
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != want ||
			w.Header().Get(answer.DecisionHeader) != "reject; reason=WatchOpenRate; retry-after="+want {
			t.Errorf("wait %v: HTTP %d, Retry-After %q, %q; want 429, %s", wait, w.Code, w.Header().Get("Retry-After"), w.Header().Get(answer.DecisionHeader), want)
		}
	}
	if admit.NewWatchOpenRate(0, 300) != nil || admit.NewWatchOpenRate(30, 0) != nil {
		t.Error("a ceiling with rate or burst 0, want none")
	}
}
