package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// Over budget, the proxy answers 429 with Retry-After and
// details.retryAfterSeconds; client-go waits that long and retries, and
// gets its watch.
func TestTooManyRequestsCarryRetryAfterAndClientGoHonoursIt(t *testing.T) {
	ctx := context.Background()
	ns := uniqueName("busy")
	sa := serviceAccount(t, ns, "busy", readWatch("configmaps"))
	p := startProxy(t, ratelimit.Budget{
		Name: "one-per-second", Precedence: 1, Enforcement: ratelimit.Enforce,
		Subjects: []ratelimit.Subject{{Kind: ratelimit.ServiceAccount, Namespace: ns, Name: "busy"}},
		Limits:   ratelimit.Limits{WatchOpensPerMinute: 30, WatchBurst: 1},
	})
	cs, err := kubernetes.NewForConfig(p.Config(sa.Token, true))
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.ListOptions{ResourceVersion: "1", TimeoutSeconds: ptrTo(int64(1))}
	w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, opts)
	if err != nil {
		t.Fatalf("first watch: %v", err)
	}
	w.Stop()

	resp, body := rawGet(t, p, sa.Token, "/api/v1/namespaces/"+ns+"/configmaps?watch=true&timeoutSeconds=1&resourceVersion=1", nil)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second watch at once: HTTP %d %s, want 429", resp.StatusCode, body)
	}
	var status metav1.Status
	if err := json.Unmarshal(body, &status); err != nil || status.Kind != "Status" || status.Reason != metav1.StatusReasonTooManyRequests ||
		status.Details == nil || status.Details.RetryAfterSeconds < 1 || status.Details.RetryAfterSeconds > 2 {
		t.Fatalf("429 body = %s, want a Status TooManyRequests with details.retryAfterSeconds 1 or 2", body)
	}
	secs := strconv.Itoa(int(status.Details.RetryAfterSeconds))
	if got := resp.Header.Get("Retry-After"); got != secs {
		t.Errorf("Retry-After = %q, want %q as in the Status", got, secs)
	}
	if got, want := resp.Header.Get(proxy.DecisionHeader), "reject; reason=RateLimited; budget=one-per-second; retry-after="+secs; got != want {
		t.Errorf("%s = %q, want %q", proxy.DecisionHeader, got, want)
	}

	// client-go: the first attempt is rejected, it waits Retry-After and
	// its retry is admitted.
	rejected := proxyMetric(t, "watchgate_proxy_requests_total", map[string]string{"budget": "one-per-second", "decision": "reject"})
	start := time.Now()
	w, err = cs.CoreV1().ConfigMaps(ns).Watch(ctx, opts)
	if err != nil {
		t.Fatalf("client-go watch: %v, want success after honouring Retry-After", err)
	}
	w.Stop()
	if n := proxyMetric(t, "watchgate_proxy_requests_total", map[string]string{"budget": "one-per-second", "decision": "reject"}) - rejected; n < 1 {
		t.Errorf("client-go's watch was never rejected (%v rejections); the test proves nothing", n)
	}
	if elapsed := time.Since(start); elapsed < time.Second {
		t.Errorf("client-go got its watch after %v, before the 1s Retry-After", elapsed)
	}
}
