package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

// clientFrom is an HTTP client of the proxy whose connections come from
// the loopback address ip (127.0.0.0/8 is all loopback on Linux), so that
// a test can be two clients.
func (p *testProxy) clientFrom(ip string) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.CA)
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext,
			TLSClientConfig:     &tls.Config{RootCAs: pool},
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 64,
		},
	}
}

// send sends GET path with token and header pairs, reads the body, and
// returns the status code and the decision header.
func send(c *http.Client, url, token, path string, headers ...string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url+path, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header.Get(proxy.DecisionHeader), nil
}

// apiServerRequests is the API server's own count of requests (from its
// /metrics) for resource and verb.
func apiServerRequests(t *testing.T, resource, verb string) float64 {
	t.Helper()
	fams, err := env.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return apiserver.Sum(fams, "apiserver_request_total", map[string]string{"resource": resource, "verb": verb})
}

func randomString(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// forge keeps a real token's header and claims and replaces its signature.
func forge(token string) string {
	i := strings.LastIndex(token, ".")
	return token[:i+1] + randomString(256)
}

// A flood of random tokens must not lock valid
// clients out, and must not become a flood of TokenReviews. Twenty
// goroutines on another loopback network send random tokens (opaque
// strings, and forged JWTs naming the API server's issuer and key) as fast
// as they can for 30 s to two proxies: one verifying service-account
// tokens locally (the default) and one that reviews every token. Meanwhile
// a brand-new service-account token and one already seen are served on
// their first try by both, and the API server counts at most a fixed
// number of TokenReviews (the per-client bucket: 20 + 5/s per proxy).
func TestRandomTokenFloodDoesNotLockOutValidClients(t *testing.T) {
	ns := uniqueName("flood")
	rules := readWatch("pods")
	seen := serviceAccount(t, ns, "seen", rules)
	local := startProxyWith(t, nil, generous("everyone", 100))
	reviewing := startProxyWith(t, func(o *proxy.Options) { o.LocalServiceAccountTokens = new(bool) }, generous("everyone", 100))
	path := "/api/v1/namespaces/" + ns + "/pods"
	// The valid clients are on another network than the flood's: TokenReview
	// buckets are per /24 (a new token from the flooding network waits
	// with it; TestTokenReviewBucketsArePerNetwork).
	valid := map[string]*http.Client{"local": local.clientFrom("127.0.1.1"), "reviewing": reviewing.clientFrom("127.0.1.1")}
	urls := map[string]string{"local": local.URL, "reviewing": reviewing.URL}
	before := apiServerRequests(t, "tokenreviews", "POST")
	for name, c := range valid { // the "seen" token is now cached (reviewing) or its key known (local)
		if code, _, err := send(c, urls[name], seen.Token, path); err != nil || code != http.StatusOK {
			t.Fatalf("%s before the flood: HTTP %d %v", name, code, err)
		}
	}
	if d := apiServerRequests(t, "tokenreviews", "POST") - before; d != 1 {
		t.Fatalf("the first requests cost %v TokenReviews, want 1 (the reviewing proxy's; the counter must count)", d)
	}

	reviewsBefore := apiServerRequests(t, "tokenreviews", "POST")
	const duration = 30 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var sent, throttled, unauthorized atomic.Int64
	var wg sync.WaitGroup
	for g := range 20 {
		c := local.clientFrom("127.0.0.2")
		if g%2 == 1 {
			c = reviewing.clientFrom("127.0.0.2")
		}
		url := local.URL
		if g%2 == 1 {
			url = reviewing.URL
		}
		wg.Go(func() {
			for i := 0; ctx.Err() == nil && i < 1_000_000; i++ {
				token := randomString(32)
				if i%2 == 0 {
					token = forge(seen.Token)
				}
				code, _, err := send(c, url, token, path)
				if err != nil {
					continue
				}
				sent.Add(1)
				switch code {
				case http.StatusTooManyRequests:
					throttled.Add(1)
				case http.StatusUnauthorized:
					unauthorized.Add(1)
				default:
					t.Errorf("a random token got HTTP %d", code)
				}
			}
		})
	}
	time.Sleep(duration / 3) // let the flood spend every shared budget it can
	for name, c := range valid {
		fresh := serviceAccount(t, ns, "new-"+name, rules)
		for what, token := range map[string]string{"a brand-new token": fresh.Token, "a token seen before": seen.Token} {
			code, _, err := send(c, urls[name], token, path)
			if err != nil || code != http.StatusOK {
				t.Errorf("%s through the %s proxy during the flood: HTTP %d %v, want 200 on the first try", what, name, code, err)
			}
		}
	}
	wg.Wait()
	reviews := apiServerRequests(t, "tokenreviews", "POST") - reviewsBefore
	// Per proxy: the flooding address's bucket (burst 20, 5/s) and the
	// valid clients' two reviews, with a second of slack.
	limit := 2 * (20 + 5*(duration.Seconds()+1) + 2)
	t.Logf("flood: %d requests (%d 401, %d 429), %v TokenReviews (limit %v)", sent.Load(), unauthorized.Load(), throttled.Load(), reviews, limit)
	if sent.Load() < 1000 {
		t.Fatalf("the flood sent only %d requests; the test proves nothing", sent.Load())
	}
	if reviews > limit {
		t.Errorf("%v TokenReviews during the flood, want at most %v", reviews, limit)
	}
}

// Impersonation checks only where a budget decides,
// and a flood of random Impersonate-User values from a caller without
// rights neither costs unbounded SubjectAccessReviews nor changes how an
// authorised agent's impersonated user is charged.
func TestImpersonationFloodDoesNotChangeHowAnAgentsUsersAreCharged(t *testing.T) {
	ns := uniqueName("imp")
	bob := "bob-" + ns
	agent := serviceAccount(t, ns, "agent", readWatch("pods"),
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}, ResourceNames: []string{bob}})
	intruder := serviceAccount(t, ns, "intruder", readWatch("pods"))
	// bob may list pods too, so the forwarded request succeeds as bob.
	if _, err := env.Clientset.RbacV1().ClusterRoleBindings().Create(context.Background(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "watchgate-test:" + bob},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "watchgate-test:" + ns + ":agent"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: bob}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := env.WaitAllowed(context.Background(), ns, bob, nil, readWatch("pods")); err != nil {
		t.Fatal(err)
	}
	bobsBudget := generous("bob-"+ns, 10)
	bobsBudget.Subjects = []ratelimit.Subject{{Kind: ratelimit.User, Name: bob}}
	// Allowed checks are remembered for a second only, so that the
	// agent's checks are real SubjectAccessReviews during the flood.
	p := startProxyWith(t, func(o *proxy.Options) { o.ImpersonationCacheTTL = time.Second }, bobsBudget, generous("everyone", 100))
	c := p.clientFrom("127.0.0.1")
	path := "/api/v1/namespaces/" + ns + "/pods"

	// Requests no budget decides cost no review at all.
	sars := apiServerRequests(t, "subjectaccessreviews", "POST")
	for i := range 50 {
		if _, _, err := send(c, p.URL, intruder.Token, "/version", authenticationv1.ImpersonateUserHeader, fmt.Sprintf("nobody-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if d := apiServerRequests(t, "subjectaccessreviews", "POST") - sars; d != 0 {
		t.Errorf("/version with Impersonate-User cost %v SubjectAccessReviews, want 0", d)
	}

	want := "allow; budget=" + bobsBudget.Name
	sars = apiServerRequests(t, "subjectaccessreviews", "POST")
	code, decision, err := send(c, p.URL, agent.Token, path, authenticationv1.ImpersonateUserHeader, bob)
	if err != nil || code != http.StatusOK || decision != want {
		t.Fatalf("agent as bob before the flood: HTTP %d %q %v, want 200 %q", code, decision, err, want)
	}
	// Two: as kube-apiserver, the constrained user-info mode is tried
	// first (impersonate-on:user-info:list, refused), then the legacy one.
	if d := apiServerRequests(t, "subjectaccessreviews", "POST") - sars; d != 2 {
		t.Fatalf("the agent's first check cost %v SubjectAccessReviews, want 2 (the counter must count)", d)
	}

	sars = apiServerRequests(t, "subjectaccessreviews", "POST")
	const duration = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var sent atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		fc := p.clientFrom("127.0.0.2")
		wg.Go(func() {
			for i := 0; ctx.Err() == nil && i < 1_000_000; i++ {
				if _, _, err := send(fc, p.URL, intruder.Token, path, authenticationv1.ImpersonateUserHeader, "u-"+randomString(12)); err == nil {
					sent.Add(1)
				}
			}
		})
	}
	agentChecks := 0
	for ctx.Err() == nil {
		code, decision, err := send(c, p.URL, agent.Token, path, authenticationv1.ImpersonateUserHeader, bob)
		if err != nil || code != http.StatusOK || decision != want {
			t.Errorf("agent as bob during the flood: HTTP %d %q %v, want 200 %q", code, decision, err, want)
		}
		agentChecks++
		time.Sleep(300 * time.Millisecond)
	}
	wg.Wait()
	reviews := apiServerRequests(t, "subjectaccessreviews", "POST") - sars
	limit := 200 + 20*(duration.Seconds()+1) + 1
	t.Logf("impersonation flood: %d requests, %v SubjectAccessReviews (limit %v), %d agent requests", sent.Load(), reviews, limit, agentChecks)
	if sent.Load() < 500 {
		t.Fatalf("the flood sent only %d requests; the test proves nothing", sent.Load())
	}
	if reviews > limit {
		t.Errorf("%v SubjectAccessReviews during the flood, want at most %v", reviews, limit)
	}
}
