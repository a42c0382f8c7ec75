package admit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/ratelimit"
)

func TestWarningLimiterTimeline(t *testing.T) {
	const interval = time.Minute
	l := NewWarningLimiter(interval, 3)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for i, step := range []struct {
		at           time.Time
		user, budget string
		want         bool
		remembered   int
	}{
		{at(0), "alice", "b1", true, 1},
		{at(time.Second), "alice", "b1", false, 1},
		// Another budget, another identity: warned on their own.
		{at(2 * time.Second), "alice", "b2", true, 2},
		{at(3 * time.Second), "bob", "b1", true, 3},
		{at(59 * time.Second), "alice", "b1", false, 3},
		// A minute after alice's first warning about b1 she is warned again;
		// her first pair was idle and forgotten, then remembered anew.
		{at(interval), "alice", "b1", true, 3},
		// Full: carol pushes out the least recently warned (alice/b2), so
		// alice/b2 is warned again early, nobody is held back.
		{at(interval + time.Second), "carol", "b1", true, 3},
		{at(interval + 2*time.Second), "alice", "b2", true, 3},
		{at(interval + 3*time.Second), "carol", "b1", false, 3},
		{at(interval + 4*time.Second), "bob", "b1", true, 3}, // pushed out by alice/b2
		// Names that differ only in where budget ends and user begins
		// are different pairs.
		{at(interval + 5*time.Second), "1", "b", true, 3},
		{at(interval + 6*time.Second), "", "b1", true, 3},
		// Everyone idle: all forgotten.
		{at(10 * interval), "dave", "b1", true, 1},
	} {
		if got := l.allow(step.at, step.user, step.budget, nil); got != step.want {
			t.Errorf("step %d (%s about %s at +%s): allow = %v, want %v", i, step.user, step.budget, step.at.Sub(t0), got, step.want)
		}
		if got := l.len(); got != step.remembered {
			t.Errorf("step %d: %d pairs remembered, want %d", i, got, step.remembered)
		}
	}
}

func TestWarningLimiterStaysBounded(t *testing.T) {
	l := NewWarningLimiter(time.Hour, 100)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10000 {
		if !l.allow(now, fmt.Sprintf("user-%d-%s", i, strings.Repeat("x", 1000)), "b", &rejection{}) {
			t.Fatalf("user %d, never warned before, was held back", i)
		}
	}
	if got := l.len(); got != 100 {
		t.Errorf("%d pairs remembered, want the bound 100", got)
	}
	if got := l.owing.Load(); got != 100 {
		t.Errorf("%d pairs owe a repeat, want 100 (those remembered)", got)
	}
}

func TestWarningLimiterOwesARetriedRejectionOnce(t *testing.T) {
	l := NewWarningLimiter(time.Minute, 10)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &rejection{verb: ratelimit.VerbList, reason: ratelimit.ReasonRateLimited, retryAfterSeconds: 35}
	if _, ok := l.owed("alice", "b"); ok {
		t.Fatal("owed before any warning")
	}
	if !l.allow(t0, "alice", "b", r) {
		t.Fatal("first warning held back")
	}
	if _, ok := l.owed("bob", "b"); ok {
		t.Error("bob owed alice's rejection")
	}
	if _, ok := l.owed("alice", "other"); ok {
		t.Error("alice owed a rejection under another budget")
	}
	if got, ok := l.owed("alice", "b"); !ok || got != *r {
		t.Errorf("owed = %+v, %v; want %+v", got, ok, *r)
	}
	if _, ok := l.owed("alice", "b"); ok {
		t.Error("owed twice")
	}
	// A 429 within the interval is not warned, so it owes nothing either.
	if l.allow(t0.Add(time.Second), "alice", "b", r) {
		t.Error("second warning within the interval")
	}
	if _, ok := l.owed("alice", "b"); ok {
		t.Error("owed a rejection that was not warned")
	}
	// Forgotten when idle.
	l.allow(t0.Add(2*time.Minute), "alice", "b", r)
	l.allow(t0.Add(4*time.Minute), "bob", "b", nil)
	if _, ok := l.owed("alice", "b"); ok || l.owing.Load() != 0 {
		t.Errorf("an idle pair's repeat kept (%d owing)", l.owing.Load())
	}
}

func TestWarningText(t *testing.T) {
	for name, tc := range map[string]struct {
		verb ratelimit.Verb
		d    ratelimit.Decision
		want string
	}{
		"a DryRun budget would have rejected a list": {
			verb: ratelimit.VerbList,
			d:    ratelimit.Decision{Allowed: true, DryRun: true, Reason: ratelimit.ReasonRateLimited, Budget: "catch-all", RetryAfter: time.Second},
			want: `watchgate budget "catch-all" (DryRun) would have rejected this list: too many watch or list requests`,
		},
		"an Enforce budget rejected a watch for 35 s": {
			verb: ratelimit.VerbWatch,
			d:    ratelimit.Decision{Reason: ratelimit.ReasonTooManyWatches, Budget: "team", RetryAfter: 34500 * time.Millisecond},
			want: `watchgate budget "team" rejected this watch: too many open watches; retry after 35s`,
		},
		"a stale watch answered locally": {
			verb: ratelimit.VerbWatch,
			d:    ratelimit.Decision{Reason: ratelimit.ReasonStaleResourceVersion, Budget: "team"},
			want: `watchgate budget "team" answered this watch with 410 Expired: resubscribing with a resourceVersion the API server declared too old; list again, then watch from the list's resourceVersion`,
		},
		"a budget name with a quote and a control character": {
			verb: ratelimit.VerbList,
			d:    ratelimit.Decision{Reason: ratelimit.ReasonRateLimited, Budget: "a\"b\x01", RetryAfter: time.Second},
			want: `watchgate budget "a\"b\x01" rejected this list: too many watch or list requests; retry after 1s`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := warningText(tc.verb, &tc.d)
			if got != tc.want {
				t.Errorf("warningText = %q, want %q", got, tc.want)
			}
			if _, err := utilnet.NewWarningHeader(299, "-", got); err != nil {
				t.Errorf("not a valid warning text: %v", err)
			}
		})
	}
}

func TestRejectionDelayEndsWhenTheClientLeaves(t *testing.T) {
	a := &Admission{MaxDelay: time.Hour, DelaySlots: NewDelaySlots(1), Clock: clock.RealClock{}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	if a.delay(ctx, "a", time.Hour, time.Hour) {
		t.Error("delay reported the client present")
	}
	if time.Since(start) > time.Second {
		t.Error("delay outlived the client")
	}
	// With every slot taken, rejections are answered at once.
	a.DelaySlots.take("b")
	start = time.Now()
	if !a.delay(context.Background(), "a", time.Hour, time.Hour) || time.Since(start) > time.Second {
		t.Error("delay waited without a free slot")
	}
}

// A stale watch's answer is held for the engine's whole hold (which grows
// with the budget's backoff while a client loops on the version), up to
// MaxStaleDelay; any other rejection at most MaxDelay.
func TestAStaleWatchIsHeldForItsBackoff(t *testing.T) {
	stale := &request.Classification{Verb: ratelimit.VerbWatch, Resource: "configmaps", ResourceVersion: "5"}
	list := &request.Classification{Verb: ratelimit.VerbList, Resource: "configmaps"}
	for name, tc := range map[string]struct {
		c        *request.Classification
		reason   ratelimit.Reason
		wantHeld time.Duration
		wantCode int
	}{
		"a stale watch, up to MaxStaleDelay":  {stale, ratelimit.ReasonStaleResourceVersion, 10 * time.Second, http.StatusOK},
		"a rate-limited list, up to MaxDelay": {list, ratelimit.ReasonRateLimited, time.Second, http.StatusTooManyRequests},
	} {
		t.Run(name, func(t *testing.T) {
			fc := clocktesting.NewFakeClock(time.Now())
			a := &Admission{MaxDelay: time.Second, MaxStaleDelay: 10 * time.Second, DelaySlots: NewDelaySlots(1), Clock: fc}
			rec := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodGet, "/api/v1/configmaps?watch=true&resourceVersion=5", nil)
			d := &ratelimit.Decision{Reason: tc.reason, RetryAfter: 30 * time.Second, Budget: "b"}
			done := make(chan struct{})
			go func() { defer close(done); a.reject(rec, r, tc.c, d) }()
			for !fc.HasWaiters() {
				time.Sleep(time.Millisecond)
			}
			fc.Step(tc.wantHeld - time.Millisecond)
			if !fc.HasWaiters() {
				t.Fatalf("answered before %v", tc.wantHeld)
			}
			fc.Step(time.Millisecond)
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("not answered after %v", tc.wantHeld)
			}
			if rec.Code != tc.wantCode {
				t.Errorf("answered %d, want %d", rec.Code, tc.wantCode)
			}
		})
	}
}
