package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
)

// reviewsSent is the proxy's count of reviews of kind sent (token,
// impersonation), across every proxy of the test process.
func reviewsSent(t *testing.T, kind string) float64 {
	return proxyMetric(t, "watchgate_proxy_reviews_sent_total", map[string]string{"review": kind})
}

// An impersonating agent's lists cost a SubjectAccessReview only when a
// budget charges them as the agent or as the impersonated user: with only
// an Exempt budget (or none) governing them, the proxy sends none and the
// API server authorizes the impersonation itself.
func TestNoImpersonationReviewWhereNoBudgetCharges(t *testing.T) {
	ns := uniqueName("sar")
	agent := serviceAccount(t, ns, "agent", readWatch("pods"),
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}})
	path := "/api/v1/namespaces/" + ns + "/pods"
	send10 := func(p *testProxy, prefix string) {
		t.Helper()
		c := p.clientFrom("127.0.0.1")
		for i := range 10 {
			code, _, err := send(c, p.URL, agent.Token, path, "Impersonate-User", fmt.Sprintf("%s-%d", prefix, i))
			if err != nil || code != http.StatusForbidden { // the API server's answer: the users may not list pods
				t.Fatalf("impersonating %s-%d: HTTP %d %v, want the API server's 403", prefix, i, code, err)
			}
		}
	}

	exempt := generous("exempt", 10)
	exempt.Enforcement = ratelimit.Exempt
	elsewhere := generous("elsewhere", 10)
	elsewhere.Resources = []ratelimit.ResourceRule{{Resources: []string{"configmaps"}}}
	for name, budgets := range map[string][]ratelimit.Budget{"only Exempt": {exempt}, "none for pods": {elsewhere}} {
		t.Run(name, func(t *testing.T) {
			p := startProxy(t, budgets...)
			before := reviewsSent(t, "impersonation")
			send10(p, "nobody")
			if n := reviewsSent(t, "impersonation") - before; n != 0 {
				t.Errorf("%v SubjectAccessReviews sent for 10 lists no budget charges, want 0", n)
			}
		})
	}
	t.Run("a budget charges the impersonated users", func(t *testing.T) {
		p := startProxy(t, generous("everyone", 10))
		before := reviewsSent(t, "impersonation")
		send10(p, "charged")
		// One per user, and once the constrained user-info mode's
		// impersonate-on:user-info:list, tried first as kube-apiserver
		// tries it, refused, and remembered.
		if n := reviewsSent(t, "impersonation") - before; n != 11 {
			t.Errorf("%v SubjectAccessReviews sent for 10 impersonated users a budget charges, want 11", n)
		}
	})
}

// A flood of random tokens from many addresses and networks empties the
// shared TokenReview bucket; a caller whose token was valid a moment ago,
// in one of the flooded networks, still revalidates it every time its
// cached answer expires, and is never refused.
func TestKnownTokenIsNotRefusedDuringAFloodOfUnknownOnes(t *testing.T) {
	ns := uniqueName("lane")
	sa := serviceAccount(t, ns, "reader", readWatch("pods"))
	p := startProxyWith(t, func(o *proxy.Options) {
		no := false
		o.LocalServiceAccountTokens = &no // every token is reviewed, like a non-service-account token
		o.TokenCacheTTL = time.Second
		o.ReviewsPerSecond, o.ReviewBurst = 8, 8
	}, generous("everyone", 10))
	path := "/api/v1/namespaces/" + ns + "/pods"
	good := p.clientFrom("127.0.0.1")
	if code, _, err := send(good, p.URL, sa.Token, path); err != nil || code != http.StatusOK {
		t.Fatalf("first request: HTTP %d %v", code, err)
	}

	ctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	var flooders sync.WaitGroup
	var mu sync.Mutex
	floodCodes := map[int]int{}
	var addrs []string
	for i := 2; i < 10; i++ {
		addrs = append(addrs, fmt.Sprintf("127.0.0.%d", i)) // the good caller's network
	}
	for i := 10; i < 20; i++ {
		addrs = append(addrs, fmt.Sprintf("127.0.%d.1", i))
	}
	for _, a := range addrs {
		c := p.clientFrom(a)
		flooders.Go(func() {
			for n := 0; n < 300 && ctx.Err() == nil; n++ {
				code, _, err := send(c, p.URL, randomString(32), path)
				if err == nil {
					mu.Lock()
					floodCodes[code]++
					mu.Unlock()
				}
			}
		})
	}
	refused := map[int]int{}
	requests := 0
	for ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		code, _, err := send(good, p.URL, sa.Token, path)
		if err != nil {
			t.Fatal(err)
		}
		requests++
		if code != http.StatusOK {
			refused[code]++
		}
	}
	flooders.Wait()
	mu.Lock()
	defer mu.Unlock()
	if floodCodes[http.StatusTooManyRequests] == 0 {
		t.Fatalf("the flood was never throttled (%v): it did not empty the shared bucket, the test proves nothing", floodCodes)
	}
	if len(refused) > 0 {
		t.Errorf("the known caller was refused %v of %d requests during the flood (flood answers %v)", refused, requests, floodCodes)
	}
}

// TokenReview buckets are per network: ten addresses of one /24 share
// one, and a caller of another /24 keeps its own.
func TestTokenReviewBucketsArePerNetwork(t *testing.T) {
	ns := uniqueName("prefix")
	first := serviceAccount(t, ns, "first", readWatch("pods"))
	second := serviceAccount(t, ns, "second", readWatch("pods"))
	p := startProxyWith(t, func(o *proxy.Options) {
		no := false
		o.LocalServiceAccountTokens = &no
		o.TokenReviewsPerClientPerSecond, o.TokenReviewClientBurst = 0.001, 5
	}, generous("everyone", 10))
	path := "/api/v1/namespaces/" + ns + "/pods"
	before := reviewsSent(t, "token")
	for i := 2; i < 12; i++ {
		c := p.clientFrom(fmt.Sprintf("127.0.0.%d", i))
		for range 3 {
			if _, _, err := send(c, p.URL, randomString(32), path); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := reviewsSent(t, "token") - before; n != 5 {
		t.Errorf("%v TokenReviews for 30 random tokens from 10 addresses of one /24, want its burst 5", n)
	}
	if code, _, err := send(p.clientFrom("127.0.0.12"), p.URL, first.Token, path); err != nil || code != http.StatusTooManyRequests {
		t.Errorf("a new token from the flooded /24: HTTP %d %v, want 429", code, err)
	}
	if code, _, err := send(p.clientFrom("127.0.1.1"), p.URL, second.Token, path); err != nil || code != http.StatusOK {
		t.Errorf("a new token from another /24: HTTP %d %v, want 200", code, err)
	}
}

// A token bound to a pod is refused locally, with 401 and without being
// charged, once the pod is deleted, as kube-apiserver refuses it.
func TestTokenOfADeletedPodIsRefusedLocally(t *testing.T) {
	ctx := context.Background()
	ns := uniqueName("bound")
	sa := serviceAccount(t, ns, "agent", readWatch("pods"))
	pod, err := env.Clientset.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agent-0"},
		Spec:       corev1.PodSpec{ServiceAccountName: sa.Name, Containers: []corev1.Container{{Name: "agent", Image: "agent"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := env.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := tr.Status.Token
	p := startProxyWith(t, func(o *proxy.Options) {
		o.TokenCacheTTL, o.TokenCacheNegativeTTL = 2*time.Second, time.Second
	}, generous("everyone", 10))
	c := p.clientFrom("127.0.0.1")
	path := "/api/v1/namespaces/" + ns + "/pods"
	if code, decision, err := send(c, p.URL, token, path); err != nil || code != http.StatusOK || decision == "" {
		t.Fatalf("with its pod: HTTP %d %q %v, want 200 and a decision", code, decision, err)
	}
	revoked := proxyMetric(t, "watchgate_proxy_local_token_verifications_total", map[string]string{"result": "revoked"})

	if err := env.Clientset.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the token of the deleted pod refused", func() (bool, error) {
		code, decision, err := send(c, p.URL, token, path)
		if err != nil {
			return false, err
		}
		if code != http.StatusUnauthorized {
			return false, fmt.Errorf("HTTP %d", code)
		}
		if decision != "" {
			t.Fatalf("401 with decision %q: it was charged and forwarded, not refused locally", decision)
		}
		return true, nil
	})
	if n := proxyMetric(t, "watchgate_proxy_local_token_verifications_total", map[string]string{"result": "revoked"}) - revoked; n < 1 {
		t.Errorf("%v tokens counted revoked, want at least 1", n)
	}
}
