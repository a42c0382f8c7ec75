package authn

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/callertest"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/review"
)

func TestAuthentication(t *testing.T) {
	for name, tc := range map[string]struct {
		header   string
		auth     authenticator.Token
		wantCode int
		wantUser string
	}{
		"no Authorization header gets 401 unforwarded": {header: "", auth: callertest.Tokens, wantCode: 401},
		"basic auth is not a bearer token":             {header: "Basic YWxpY2U6cHc=", auth: callertest.Tokens, wantCode: 401},
		"an unknown token gets 401 unforwarded":        {header: "Bearer nope", auth: callertest.Tokens, wantCode: 401},
		"a known token reaches the next filter":        {header: "Bearer alice", auth: callertest.Tokens, wantCode: 200, wantUser: "alice"},
		"the scheme is case-insensitive":               {header: "bearer alice", auth: callertest.Tokens, wantCode: 200, wantUser: "alice"},
		"a WebSocket may carry the token as a subprotocol": {
			header: "ws:base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte("alice")), auth: callertest.Tokens, wantCode: 200, wantUser: "alice",
		},
		"a WebSocket subprotocol that is not base64 is no token": {
			header: "ws:base64url.bearer.authorization.k8s.io.!!", auth: callertest.Tokens, wantCode: 401,
		},
		"throttled reviews get 429 with Retry-After":    {header: "Bearer alice", auth: failingTokens(review.ErrThrottled), wantCode: 429},
		"a review that fails gets 503 with Retry-After": {header: "Bearer alice", auth: failingTokens(errors.New("boom")), wantCode: 503},
		"an oversized token is rejected without review": {header: "Bearer " + string(make([]byte, MaxTokenBytes+1)), auth: failingTokens(errors.New("reviewed")), wantCode: 401},
	} {
		t.Run(name, func(t *testing.T) {
			var got string
			h := WithAuthentication(tc.auth, review.FailClosed, logtest.Discard(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				u, _ := request.CallerFrom(r.Context())
				got = u.GetName()
			}))
			marked := false
			req := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil)
			req = req.WithContext(WithConnection(req.Context(), func() { marked = true }))
			if proto, ok := strings.CutPrefix(tc.header, "ws:"); ok {
				req.Header.Set("Upgrade", "websocket")
				req.Header.Set("Connection", "Upgrade")
				req.Header.Set("Sec-WebSocket-Protocol", "v4.channel.k8s.io, "+proto)
			} else if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.wantCode || got != tc.wantUser {
				t.Fatalf("HTTP %d, user %q; want %d, %q", rec.Code, got, tc.wantCode, tc.wantUser)
			}
			if marked != (tc.wantCode == 200) {
				t.Errorf("connection marked authenticated: %v, want %v", marked, tc.wantCode == 200)
			}
			if tc.wantCode == 200 {
				if !strings.HasPrefix(tc.header, "ws:") && req.Header.Get("Authorization") != tc.header {
					t.Errorf("Authorization header changed to %q", req.Header.Get("Authorization"))
				}
				return
			}
			var s metav1.Status
			if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil || s.Kind != "Status" || int(s.Code) != tc.wantCode {
				t.Errorf("body %q is not a Status with code %d", rec.Body, tc.wantCode)
			}
			if tc.wantCode != 401 && rec.Header().Get("Retry-After") != "1" {
				t.Errorf("Retry-After = %q, want 1", rec.Header().Get("Retry-After"))
			}
		})
	}
}

func failingTokens(err error) authenticator.Token {
	return authenticator.TokenFunc(func(context.Context, string) (*authenticator.Response, bool, error) { return nil, false, err })
}

// countingTokens accepts "good" and counts reviews.
type countingTokens struct {
	calls   atomic.Int64
	release chan struct{} // when set, reviews wait for it
}

func (c *countingTokens) AuthenticateToken(_ context.Context, token string) (*authenticator.Response, bool, error) {
	c.calls.Add(1)
	if c.release != nil {
		<-c.release
	}
	return callertest.Tokens.AuthenticateToken(context.Background(), map[string]string{"good": "alice"}[token])
}

func TestTokenCache(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()

	t.Run("a good and a bad token are each reviewed once per TTL", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0)
		inner := &countingTokens{}
		auth := CachedTokens(inner, review.NewCache("token", 100, review.NewBudget(10, 10, 1000, 1000, 100), 4, 10*time.Second, clk), nil, time.Minute, 10*time.Second, 0)
		for range 5 {
			if _, ok, err := auth.AuthenticateToken(ctx, "good"); !ok || err != nil {
				t.Fatalf("good token: %v %v", ok, err)
			}
			if _, ok, err := auth.AuthenticateToken(ctx, "bad"); ok || err != nil {
				t.Fatalf("bad token: %v %v", ok, err)
			}
		}
		if n := inner.calls.Load(); n != 2 {
			t.Fatalf("reviews = %d, want 2", n)
		}
		clk.Step(11 * time.Second) // the bad token's answer expired, the good one's not
		_, _, _ = auth.AuthenticateToken(ctx, "good")
		_, _, _ = auth.AuthenticateToken(ctx, "bad")
		if n := inner.calls.Load(); n != 3 {
			t.Fatalf("reviews after 11s = %d, want 3", n)
		}
	})

	t.Run("the requester is worked out only for a review, and its own bucket pays", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0) // time stands still: no refill
		inner := &countingTokens{}
		auth := CachedTokens(inner, review.NewCache("token", 100, review.NewBudget(1000, 1000, 0.001, 1, 100), 4, 10*time.Second, clk), nil, time.Minute, 10*time.Second, 0)
		asked := map[string]int{}
		from := func(network string) context.Context {
			return review.WithRequesterOf(ctx, func() string { asked[network]++; return network })
		}
		for range 5 {
			if _, ok, err := auth.AuthenticateToken(from("10.0.0.0/24"), "good"); !ok || err != nil {
				t.Fatalf("good token: %v %v", ok, err)
			}
		}
		if asked["10.0.0.0/24"] != 1 || inner.calls.Load() != 1 {
			t.Fatalf("requester worked out %d times for 1 review and 4 cached answers (reviews %d); want once", asked["10.0.0.0/24"], inner.calls.Load())
		}
		if _, _, err := auth.AuthenticateToken(from("10.0.0.0/24"), "other"); !errors.Is(err, review.ErrThrottled) {
			t.Fatalf("a second review from a network whose bucket holds 1: %v, want throttled", err)
		}
		if _, _, err := auth.AuthenticateToken(from("10.0.1.0/24"), "other"); err != nil || inner.calls.Load() != 2 {
			t.Fatalf("another network's review: %v, %d reviews; want its own bucket to pay for a second", err, inner.calls.Load())
		}
	})

	t.Run("a flood of random tokens costs at most the review burst", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0) // time stands still: no refill
		inner := &countingTokens{}
		auth := CachedTokens(inner, review.NewCache("token", 100, review.NewBudget(10, 20, 1000, 1000, 100), 4, 10*time.Second, clk), nil, time.Minute, 10*time.Second, 0)
		throttled := 0
		for i := range 1000 {
			_, ok, err := auth.AuthenticateToken(ctx, fmt.Sprintf("random-%d", i))
			switch {
			case errors.Is(err, review.ErrThrottled):
				throttled++
			case ok || err != nil:
				t.Fatalf("random token: %v %v", ok, err)
			}
		}
		if n := inner.calls.Load(); n != 20 || throttled != 980 {
			t.Fatalf("reviews = %d, throttled = %d; want 20, 980", n, throttled)
		}
	})

	t.Run("a token valid recently revalidates through the reserved bucket, whatever floods the shared one", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(t0)
		inner := &countingTokens{}
		recent := utilcache.NewLRUExpireCacheWithClock(100, clk)
		// Buckets that refill too slowly to matter within the test.
		auth := CachedTokens(inner, review.NewCache("token", 100, review.NewBudget(0.001, 5, 1000, 1000, 100).WithReserve(0.001, 2), 4, 10*time.Second, clk),
			recent, time.Minute, 10*time.Second, time.Hour)
		if _, ok, err := auth.AuthenticateToken(ctx, "good"); !ok || err != nil {
			t.Fatalf("good token: %v %v", ok, err)
		}
		for i := range 100 {
			_, _, _ = auth.AuthenticateToken(ctx, fmt.Sprintf("random-%d", i))
		}
		if _, _, err := auth.AuthenticateToken(ctx, "another-unknown"); !errors.Is(err, review.ErrThrottled) {
			t.Fatalf("an unknown token with the shared bucket empty: %v, want throttled", err)
		}
		for range 2 { // the good token's answer expires twice; each time it is reviewed again
			clk.Step(61 * time.Second)
			if _, ok, err := auth.AuthenticateToken(ctx, "good"); !ok || err != nil {
				t.Fatalf("good token after its answer expired: %v %v", ok, err)
			}
		}
		clk.Step(61 * time.Second)
		if _, _, err := auth.AuthenticateToken(ctx, "good"); !errors.Is(err, review.ErrThrottled) {
			t.Fatalf("a third revalidation beyond the reserved burst 2: %v, want throttled", err)
		}
	})

	t.Run("concurrent requests with one token share one review", func(t *testing.T) {
		inner := &countingTokens{release: make(chan struct{})}
		auth := CachedTokens(inner, review.NewCache("token", 100, review.NewBudget(10, 10, 1000, 1000, 100), 4, 10*time.Second, clocktesting.NewFakeClock(t0)), nil, time.Minute, time.Second, 0)
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				if _, ok, err := auth.AuthenticateToken(ctx, "good"); !ok || err != nil {
					t.Errorf("good token: %v %v", ok, err)
				}
			})
		}
		time.Sleep(50 * time.Millisecond) // let them pile up on the flight; not an assertion
		close(inner.release)
		wg.Wait()
		if n := inner.calls.Load(); n != 1 {
			t.Fatalf("reviews = %d, want 1", n)
		}
	})

	t.Run("a caller that leaves does not wait for the review", func(t *testing.T) {
		inner := &countingTokens{release: make(chan struct{})}
		defer close(inner.release)
		auth := CachedTokens(inner, review.NewCache("token", 100, review.NewBudget(10, 10, 1000, 1000, 100), 4, 10*time.Second, clocktesting.NewFakeClock(t0)), nil, time.Minute, time.Second, 0)
		cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		if _, _, err := auth.AuthenticateToken(cctx, "good"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the caller's deadline", err)
		}
	})
}

func TestClientPrefix(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:5000":            "127.0.0.0/24",
		"127.0.0.77:5000":           "127.0.0.0/24",
		"127.0.1.1:5000":            "127.0.1.0/24",
		"[2001:db8:1:2:3:4:5:6]:80": "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:80":      "2001:db8:1:3::/64",
		"[::ffff:10.1.2.3]:80":      "10.1.2.0/24",
		"[fe80::1%eth0]:80":         "fe80::/64",
		"not an address":            "not an address",
	} {
		if got := review.RequesterFrom(review.WithRequesterOf(context.Background(), clientPrefix(addr))); got != want {
			t.Errorf("the requester of a request from %q is %q, want %q", addr, got, want)
		}
	}
}

// With FailOpen, a token that could not be reviewed is charged to a user
// of its own in the group system:watchgate:unreviewed, not to one identity
// shared by every caller whose review failed.
func TestFailOpenChargesEachTokenItsOwnIdentity(t *testing.T) {
	var got []user.Info
	h := WithAuthentication(failingTokens(errors.New("boom")), review.FailOpen, logtest.Discard(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, _ := request.CallerFrom(r.Context())
		got = append(got, u)
	}))
	for _, token := range []string{"one", "two", "one"} {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("token %s: HTTP %d, want forwarded", token, rec.Code)
		}
	}
	for i, u := range got {
		if !strings.HasPrefix(u.GetName(), "system:watchgate:unreviewed:") || len(u.GetName()) > 64 ||
			len(u.GetGroups()) != 1 || u.GetGroups()[0] != "system:watchgate:unreviewed" || !review.IsUnreviewed(u) {
			t.Errorf("caller %d: %s %v, want system:watchgate:unreviewed:<hash> in group system:watchgate:unreviewed", i, u.GetName(), u.GetGroups())
		}
	}
	if got[0].GetName() == got[1].GetName() || got[0].GetName() != got[2].GetName() {
		t.Errorf("callers %s, %s, %s: want one per token", got[0].GetName(), got[1].GetName(), got[2].GetName())
	}
}
