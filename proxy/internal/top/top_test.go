package top

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	testingclock "k8s.io/utils/clock/testing"

	topv1alpha1 "github.com/watchgate/watchgate/api/top/v1alpha1"
	"github.com/watchgate/watchgate/proxy/internal/callertest"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/ratelimit"
)

func TestTopEndpointReadsAreRateLimited(t *testing.T) {
	engine := ratelimit.NewEngine(ratelimit.Options{Seed: 1})
	clk := testingclock.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	allowAll := authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
		return authorizer.DecisionAllow, "", nil
	})
	top := NewEndpoint(engine, allowAll, "replica-0", clk, logtest.Discard())
	readAs := func(caller user.Info) int {
		req := httptest.NewRequestWithContext(callertest.WithCaller(context.Background(), caller), http.MethodGet, topv1alpha1.Path, nil)
		rec := httptest.NewRecorder()
		top.ServeHTTP(rec, req)
		return rec.Code
	}
	read := func() int { return readAs(callertest.Alice) }
	for i := range topReadBurst {
		if code := read(); code != http.StatusOK {
			t.Fatalf("read %d within the burst: %d, want 200", i+1, code)
		}
	}
	if code := read(); code != http.StatusTooManyRequests {
		t.Errorf("a read beyond the burst at the same instant: %d, want 429", code)
	}
	if code := readAs(&user.DefaultInfo{Name: "bob"}); code != http.StatusOK {
		t.Errorf("another caller's read while alice's bucket is empty: %d, want 200", code)
	}
	clk.SetTime(clk.Now().Add(time.Second / topReadsPerSecond))
	if code := read(); code != http.StatusOK {
		t.Errorf("a read once a token refilled: %d, want 200", code)
	}
}
