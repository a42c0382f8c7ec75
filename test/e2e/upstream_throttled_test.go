package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

// throttleUpstream makes kube-apiserver's own flow control (APF) answer
// every request of sa with 429: a FlowSchema ahead of the default ones
// sends them to a priority level with no seats that rejects rather than
// queues. It waits until the API server does so.
func throttleUpstream(t *testing.T, sa apiserver.ServiceAccount) {
	t.Helper()
	ctx := context.Background()
	name := sa.Namespace + "-" + sa.Name
	fc := env.Clientset.FlowcontrolV1()
	_, err := fc.PriorityLevelConfigurations().Create(ctx, &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr.To[int32](0),
				LendablePercent:          ptr.To[int32](0),
				BorrowingLimitPercent:    ptr.To[int32](0),
				LimitResponse:            flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fc.PriorityLevelConfigurations().Delete(ctx, name, metav1.DeleteOptions{}) })
	fs, err := fc.FlowSchemas().Create(ctx, &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: name},
			MatchingPrecedence:         50,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{
					Kind:           flowcontrolv1.SubjectKindServiceAccount,
					ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: sa.Namespace, Name: sa.Name},
				}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
					Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"},
					Namespaces: []string{"*"}, ClusterScope: true,
				}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fc.FlowSchemas().Delete(ctx, name, metav1.DeleteOptions{}) })
	direct := directClient(t)
	eventually(t, 30*time.Second, "the API server to classify "+sa.Username()+" by the new FlowSchema", func() (bool, error) {
		resp, _ := doGet(t, direct, env.Config.Host, sa.Token, "/api/v1/namespaces/"+sa.Namespace+"/configmaps?limit=1")
		return resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID") == string(fs.UID), nil
	})
	// APF dispatches a request to a level with no seats when none is in
	// use, so one request of sa holds the level: a list of 8 MB read by
	// nobody (the API server writes it with the seat taken, until the
	// socket's buffers are full).
	for i := range 8 {
		_, err := env.Clientset.CoreV1().ConfigMaps(sa.Namespace).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ballast-%d", i)},
			Data:       map[string]string{"ballast": strings.Repeat("x", 1<<20)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.Config.CAData)
	unread := &http.Client{Transport: &http.Transport{
		TLSClientConfig:    &tls.Config{RootCAs: pool},
		DisableCompression: true,                                                   // a gzip-encoded list of 8 MB of "x" takes a few KiB
		TLSNextProto:       map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1: the socket is the only window
		DialContext: (&net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		}}).DialContext,
	}}
	hctx, release := context.WithCancel(ctx)
	t.Cleanup(release)
	go func() {
		req, err := http.NewRequestWithContext(hctx, http.MethodGet, strings.TrimSuffix(env.Config.Host, "/")+"/api/v1/namespaces/"+sa.Namespace+"/configmaps", nil)
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+sa.Token)
		if resp, err := unread.Do(req); err == nil {
			<-hctx.Done()
			_ = resp.Body.Close()
		}
	}()
	eventually(t, 30*time.Second, "the API server's 429 for "+sa.Username(), func() (bool, error) {
		resp, _ := doGet(t, direct, env.Config.Host, sa.Token, "/api/v1/namespaces/"+sa.Namespace+"/configmaps?watch=true&timeoutSeconds=1")
		return resp.StatusCode == http.StatusTooManyRequests, nil
	})
}

// directClient is an HTTP client of the API server itself.
func directClient(t *testing.T) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.Config.CAData)
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
}

// doGet sends GET path with token and returns the response (body read)
// and its body.
func doGet(t *testing.T, c *http.Client, url, token, path string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(url, "/")+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// The API server's own 429s (APF here; 1.37's consistent lists from the
// watch cache answer the same way when the cache lags) reach the client as
// they were sent — status, Retry-After and body — are counted apart from
// watchgate's own refusals, and are not failures of the watch's key: with
// a backoff of a minute after a failed watch, the next watch is forwarded
// again and answered by the API server, not refused BackingOff by
// watchgate.
func TestUpstream429PassesThroughAndNeverBacksOff(t *testing.T) {
	ns := uniqueName("throttled")
	sa := serviceAccount(t, ns, "agent", readWatch("configmaps"))
	b := generous("everyone", 10)
	b.Backoff = ratelimit.Backoff{Initial: time.Minute, Max: time.Minute, ShortWatch: time.Minute}
	p := startProxy(t, b)
	throttleUpstream(t, sa)
	c := p.clientFrom("127.0.0.1")
	direct := directClient(t)

	list := "/api/v1/namespaces/" + ns + "/configmaps"
	want, wantBody := doGet(t, direct, env.Config.Host, sa.Token, list)
	if want.StatusCode != http.StatusTooManyRequests || want.Header.Get("Retry-After") == "" {
		t.Fatalf("the API server answered HTTP %d, Retry-After %q: want its 429 with Retry-After", want.StatusCode, want.Header.Get("Retry-After"))
	}
	listsBefore := proxyMetric(t, "watchgate_proxy_upstream_throttled_total", map[string]string{"verb": "list"})
	watchesBefore := proxyMetric(t, "watchgate_proxy_upstream_throttled_total", map[string]string{"verb": "watch"})
	rejectsBefore := proxyMetric(t, "watchgate_proxy_requests_total", map[string]string{"decision": "reject"})
	endedBefore := proxyMetric(t, "watchgate_proxy_watches_ended_total", map[string]string{"outcome": "throttled"})

	got, gotBody := doGet(t, c, p.URL, sa.Token, list)
	if got.StatusCode != http.StatusTooManyRequests || got.Header.Get("Retry-After") != want.Header.Get("Retry-After") ||
		got.Header.Get("Content-Type") != want.Header.Get("Content-Type") || !bytes.Equal(gotBody, wantBody) {
		t.Errorf("list through watchgate: HTTP %d, Retry-After %q, %s %q; want the API server's HTTP %d, Retry-After %q, %s %q",
			got.StatusCode, got.Header.Get("Retry-After"), got.Header.Get("Content-Type"), gotBody,
			want.StatusCode, want.Header.Get("Retry-After"), want.Header.Get("Content-Type"), wantBody)
	}
	for i := range 3 {
		got, gotBody := doGet(t, c, p.URL, sa.Token, list+"?watch=true")
		decision := got.Header.Get(proxy.DecisionHeader)
		if got.StatusCode != http.StatusTooManyRequests || strings.HasPrefix(decision, "reject") ||
			got.Header.Get("Retry-After") != want.Header.Get("Retry-After") || !bytes.Equal(gotBody, wantBody) {
			t.Errorf("watch %d through watchgate: HTTP %d, decision %q, Retry-After %q, %q; want the API server's 429, Retry-After %q, %q",
				i, got.StatusCode, decision, got.Header.Get("Retry-After"), gotBody, want.Header.Get("Retry-After"), wantBody)
		}
	}
	if n := proxyMetric(t, "watchgate_proxy_upstream_throttled_total", map[string]string{"verb": "list"}) - listsBefore; n != 1 {
		t.Errorf("%v upstream 429s of lists counted, want 1", n)
	}
	if n := proxyMetric(t, "watchgate_proxy_upstream_throttled_total", map[string]string{"verb": "watch"}) - watchesBefore; n != 3 {
		t.Errorf("%v upstream 429s of watches counted, want 3", n)
	}
	if n := proxyMetric(t, "watchgate_proxy_watches_ended_total", map[string]string{"outcome": "throttled"}) - endedBefore; n != 3 {
		t.Errorf("%v watches ended throttled, want 3", n)
	}
	if n := proxyMetric(t, "watchgate_proxy_requests_total", map[string]string{"decision": "reject"}) - rejectsBefore; n != 0 {
		t.Errorf("%v requests counted as watchgate's own rejections, want 0", n)
	}
}
