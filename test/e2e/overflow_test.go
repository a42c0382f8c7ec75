package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"sync"
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
