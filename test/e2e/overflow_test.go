package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watchgate/watchgate/ratelimit"
)

// A token looping on a stale version with more made-up selectors than an
// identity may track backoff keys for is answered locally, and cannot back
// off the same identity's other watches (before, the made-up keys shared
// one overflow key with every untracked key of the identity, and its
// backoff reached the real agent's unrelated watch).
func TestMadeUpStaleSelectorsDoNotBackOffOtherWatches(t *testing.T) {
	ns := uniqueName("overflow")
	sa := serviceAccount(t, ns, "agent", readWatch("podtemplates", "pods"))
	rv := makeStale(t, ns)
	b := generous("everyone", 10)
	b.Backoff = ratelimit.Backoff{Initial: time.Second, Max: time.Minute, ShortWatch: time.Second}
	p := startProxy(t, b)
	c := p.clientFrom("127.0.0.1")
	backingOff := map[string]string{"verb": "watch", "reason": string(ratelimit.ReasonBackingOff)}
	backedOff := proxyMetric(t, "watchgate_proxy_requests_total", backingOff)
	stalePath := func(sel string) string {
		return "/api/v1/namespaces/" + ns + "/podtemplates?watch=true&resourceVersion=" + rv + "&labelSelector=" + url.QueryEscape(sel)
	}
	// The first teaches the proxy that rv is stale; then 80 made-up
	// selectors, more than the 64 keys an identity tracks, at once.
	if code, _, err := send(c, p.URL, sa.Token, stalePath("first=1")); err != nil || code != http.StatusOK {
		t.Fatalf("first stale watch: HTTP %d %v", code, err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 80)
	for i := range 80 {
		wg.Go(func() {
			code, decision, err := send(c, p.URL, sa.Token, stalePath(fmt.Sprint("made-up=", i)))
			if err == nil && (code != http.StatusOK || decision == "") {
				err = fmt.Errorf("made-up selector %d: HTTP %d %q, want a local 200 too-old answer", i, code, decision)
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	code, decision, err := send(c, p.URL, sa.Token, "/api/v1/namespaces/"+ns+"/pods?watch=true&timeoutSeconds=1")
	if err != nil || code != http.StatusOK {
		t.Fatalf("the identity's unrelated watch: HTTP %d %q %v, want 200", code, decision, err)
	}
	if got := proxyMetric(t, "watchgate_proxy_requests_total", backingOff) - backedOff; got != 0 {
		t.Errorf("%v watches backed off, want none", got)
	}
}

// An agent opens 200 watches at once on distinct selectors, more than the
// 64 keys an identity tracks, and all of them fail together (they end
// within shortWatchSeconds: the API server ends them after
// timeoutSeconds=1). The failures are one event: the identity's next
// watches wait the budget's initial delay, not a delay doubled once per
// failed watch up to its max.
func TestWatchesOpenedTogetherThatFailTogetherBackOffOnce(t *testing.T) {
	const watches, initial = 200, 30 * time.Second
	ns := uniqueName("wave")
	sa := serviceAccount(t, ns, "agent", readWatch("configmaps"))
	b := generous("everyone", 10)
	b.Backoff = ratelimit.Backoff{Initial: initial, Max: time.Hour, ShortWatch: time.Minute, ResetAfter: time.Hour}
	p := startProxy(t, b)
	c := p.clientFrom("127.0.0.1")
	path := func(i int) string {
		return "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=1&labelSelector=" + url.QueryEscape(fmt.Sprint("app=a", i))
	}

	var wg sync.WaitGroup
	var served, refused atomic.Int32
	errs := make(chan error, watches)
	for i := range watches {
		wg.Go(func() {
			code, decision, err := send(c, p.URL, sa.Token, path(i))
			switch {
			case err != nil:
				errs <- err
			case code == http.StatusOK:
				served.Add(1)
			case code == http.StatusTooManyRequests && strings.Contains(decision, "reason="+string(ratelimit.ReasonBackingOff)):
				// Opened after the first failures, on a key already
				// backing off: refused, so it cannot fail.
				refused.Add(1)
			default:
				errs <- fmt.Errorf("watch %d: HTTP %d %q", i, code, decision)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if served.Load() <= 64 {
		t.Fatalf("%d watches served (%d refused), want more than the 64 keys an identity tracks", served.Load(), refused.Load())
	}
	t.Logf("%d watches served and failed, %d refused while backing off", served.Load(), refused.Load())

	// Every key, tracked or not, and a key never seen, waits at most the
	// initial delay.
	for _, i := range []int{0, watches / 2, watches - 1, watches} {
		code, decision, err := send(c, p.URL, sa.Token, path(i))
		if err != nil {
			t.Fatal(err)
		}
		retry, _ := strconv.Atoi(decision[strings.LastIndex(decision, "=")+1:])
		if code != http.StatusTooManyRequests || !strings.Contains(decision, "reason="+string(ratelimit.ReasonBackingOff)) ||
			retry < 1 || time.Duration(retry)*time.Second > initial {
			t.Errorf("key %d after the failures: HTTP %d %q, want 429 BackingOff with a retry-after of at most %s", i, code, decision, initial)
		}
	}
}
