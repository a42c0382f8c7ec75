package authn

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "gopkg.in/go-jose/go-jose.v2"
	"gopkg.in/go-jose/go-jose.v2/jwt"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/review"
)

const testIssuer = "https://kubernetes.default.svc.cluster.local"

// testIssuerServer publishes the issuer and a key set that a test may
// change, counting the key-set fetches.
type testIssuerServer struct {
	mu      sync.Mutex
	keys    jose.JSONWebKeySet
	fetches atomic.Int64
}

func (s *testIssuerServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/.well-known/openid-configuration":
		_ = json.NewEncoder(w).Encode(map[string]string{"issuer": testIssuer, "jwks_uri": testIssuer + "/openid/v1/jwks"})
	case "/openid/v1/jwks":
		s.fetches.Add(1)
		s.mu.Lock()
		defer s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(s.keys)
	default:
		http.NotFound(w, r)
	}
}

func (s *testIssuerServer) publish(kid string, k *rsa.PrivateKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys.Keys = append(s.keys.Keys, jose.JSONWebKey{Key: &k.PublicKey, KeyID: kid, Algorithm: "RS256", Use: "sig"})
}

func newKey(t testing.TB) *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// saToken signs a service-account token like kube-apiserver's TokenRequest.
func saToken(t testing.TB, k *rsa.PrivateKey, kid, issuer, aud string, exp time.Time) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: k}, (&jose.SignerOptions{}).WithHeader("kid", kid))
	if err != nil {
		t.Fatal(err)
	}
	var private privateClaims
	private.Kubernetes.Namespace = "agents"
	private.Kubernetes.ServiceAccount = claimRef{Name: "agent", UID: "uid-1"}
	private.Kubernetes.Pod = &claimRef{Name: "agent-0", UID: "pod-uid"}
	tok, err := jwt.Signed(sig).Claims(jwt.Claims{
		Issuer: issuer, Subject: "system:serviceaccount:agents:agent", Audience: jwt.Audience{aud},
		Expiry: jwt.NewNumericDate(exp), NotBefore: jwt.NewNumericDate(exp.Add(-time.Hour)), IssuedAt: jwt.NewNumericDate(exp.Add(-time.Hour)), ID: "jti-1",
	}).Claims(private).CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// verifierOf serves issuer and returns local verification against it,
// with its keys fetched, verified tokens remembered for cacheTTL, and
// their objects checked with bound (nil: not checked).
func verifierOf(t testing.TB, issuer *testIssuerServer, clk clock.PassiveClock, cacheTTL time.Duration, bound *boundObjects) *ServiceAccountTokens {
	t.Helper()
	srv := httptest.NewServer(issuer)
	t.Cleanup(srv.Close)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	sa := NewServiceAccountTokens(cs.Discovery().RESTClient(), nil, clk, 100, cacheTTL, bound)
	if err := sa.refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return sa
}

func TestServiceAccountTokensVerifiedLocally(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	issuer := &testIssuerServer{}
	key, other := newKey(t), newKey(t)
	issuer.publish("k1", key)
	sa := verifierOf(t, issuer, clk, 10*time.Second, nil)
	ctx := context.Background()
	exp := t0.Add(time.Hour)
	good := saToken(t, key, "k1", testIssuer, testIssuer, exp)

	u, v := sa.verify(ctx, good, t0)
	if v != validServiceAccount || u.GetName() != "system:serviceaccount:agents:agent" || u.GetUID() != "uid-1" ||
		!slices.Equal(u.GetGroups(), []string{"system:serviceaccounts", "system:serviceaccounts:agents", "system:authenticated"}) ||
		!slices.Equal(u.GetExtra()["authentication.kubernetes.io/pod-name"], []string{"agent-0"}) {
		t.Fatalf("a valid token: %v %#v", v, u)
	}
	for name, tc := range map[string]struct {
		token string
		at    time.Time
		want  serviceAccountVerdict
	}{
		"not a JWT is reviewed":                              {token: "abc.def", at: t0, want: notLocal},
		"garbage with two dots is reviewed":                  {token: "a.b.c", at: t0, want: notLocal},
		"a bad signature with a known key is forged":         {token: good[:len(good)-4] + "AAAA", at: t0, want: forged},
		"signed by another key under a known key id: forged": {token: saToken(t, other, "k1", testIssuer, testIssuer, exp), at: t0, want: forged},
		"another issuer is reviewed":                         {token: saToken(t, key, "k1", "https://elsewhere", "https://elsewhere", exp), at: t0, want: notLocal},
		"another audience is reviewed":                       {token: saToken(t, key, "k1", testIssuer, "vault", exp), at: t0, want: notLocal},
		"an expired token is left to the API server":         {token: good, at: exp.Add(time.Second), want: notLocal},
		"a token not valid yet is left to the API server":    {token: good, at: t0.Add(-time.Second), want: notLocal},
	} {
		t.Run(name, func(t *testing.T) {
			if _, v := sa.verify(ctx, tc.token, tc.at); v != tc.want {
				t.Fatalf("verdict %v, want %v", v, tc.want)
			}
		})
	}

	t.Run("unknown key ids refresh the keys at most once per 10s", func(t *testing.T) {
		rotated := saToken(t, other, "k2", testIssuer, testIssuer, exp)
		before := issuer.fetches.Load()
		for range 100 {
			if _, v := sa.verify(ctx, rotated, clk.Now()); v != notLocal {
				t.Fatalf("verdict %v before k2 is published, want notLocal", v)
			}
		}
		if n := issuer.fetches.Load() - before; n != 1 {
			t.Fatalf("%d key fetches for 100 unknown-kid tokens, want 1", n)
		}
		issuer.publish("k2", other)
		clk.Step(5 * time.Second) // too soon: no fetch
		if _, v := sa.verify(ctx, rotated, clk.Now()); v != notLocal {
			t.Fatalf("verdict %v 5s later, want notLocal", v)
		}
		clk.Step(5 * time.Second)
		if _, v := sa.verify(ctx, rotated, clk.Now()); v != validServiceAccount {
			t.Fatalf("verdict %v 10s later, want valid (the new key fetched)", v)
		}
		if n := issuer.fetches.Load() - before; n != 2 {
			t.Fatalf("%d key fetches, want 2", n)
		}
	})

	t.Run("random key ids from one network do not delay a rotation seen from another", func(t *testing.T) {
		clk.Step(time.Minute)
		flooded := review.WithRequester(ctx, "10.0.0.0/24")
		before := issuer.fetches.Load()
		for i := range 20 {
			if _, v := sa.verify(flooded, saToken(t, other, fmt.Sprint("random-", i), testIssuer, testIssuer, exp), clk.Now()); v != notLocal {
				t.Fatalf("verdict %v for a random key id, want notLocal", v)
			}
			clk.Step(100 * time.Millisecond)
		}
		if n := issuer.fetches.Load() - before; n != 1 {
			t.Fatalf("%d key fetches for 2s of random key ids from one network, want 1", n)
		}
		rotated := newKey(t)
		issuer.publish("k3", rotated)
		clk.Step(time.Second)
		if _, v := sa.verify(review.WithRequester(ctx, "10.0.1.0/24"), saToken(t, rotated, "k3", testIssuer, testIssuer, exp), clk.Now()); v != validServiceAccount {
			t.Fatalf("verdict %v for the rotated key, from another network, want valid", v)
		}
	})

	t.Run("unknown key ids on tokens refused anyway fetch nothing", func(t *testing.T) {
		clk.Step(time.Minute)
		before := issuer.fetches.Load()
		for name, tok := range map[string]string{
			"expired":          saToken(t, other, "k9", testIssuer, testIssuer, clk.Now().Add(-time.Minute)),
			"another audience": saToken(t, other, "k9", testIssuer, "vault", exp),
		} {
			if _, v := sa.verify(ctx, tok, clk.Now()); v != notLocal {
				t.Fatalf("%s: verdict %v, want notLocal", name, v)
			}
		}
		if n := issuer.fetches.Load() - before; n != 0 {
			t.Fatalf("%d key fetches, want none", n)
		}
	})
}

func TestFairReviews(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := review.NewBudget(10, 10, 1, 5, 100).WithReserve(2, 2) // shared 10/s burst 10; each 1/s burst 5; reserved 2/s burst 2
	allowed := func(who string, lane review.Lane, n int) int {
		ok := 0
		for range n {
			if f.Allow(who, lane, t0) {
				ok++
			}
		}
		return ok
	}
	if n := allowed("flooder", review.LaneNew, 1000); n != 5 {
		t.Fatalf("a flooder got %d reviews, want its burst 5", n)
	}
	if n := allowed("valid", review.LaneNew, 1); n != 1 {
		t.Fatal("a valid client was starved by the flooder")
	}
	// Four more flooders empty the shared bucket (10 in all).
	for _, who := range []string{"f2", "f3"} {
		allowed(who, review.LaneNew, 1000)
	}
	if n := allowed("late", review.LaneNew, 1); n != 0 {
		t.Fatalf("the shared bucket should be empty, got %d", n)
	}
	if n := allowed("agent", review.LaneTrusted, 3); n != 3 {
		t.Fatalf("a trusted requester got %d of 3, want 3 (it skips the shared bucket)", n)
	}
	// A recently valid token of the flooder's own network still gets the
	// reserved reviews, and only those.
	if n := allowed("flooder", review.LaneRecent, 5); n != 2 {
		t.Fatalf("a recent token got %d of 5 reviews, want the reserved burst 2", n)
	}
}

// Issue 10 item 2: a token found valid is not verified again while its
// claims hold and the keys are the same; once the key that signed it is
// withdrawn, or past its exp, it is verified again (and no longer valid).
func TestServiceAccountTokenVerdictsCached(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	issuer := &testIssuerServer{}
	key := newKey(t)
	issuer.publish("k1", key)
	sa := verifierOf(t, issuer, clk, time.Minute, nil)
	ctx := context.Background()
	exp := t0.Add(30 * time.Second)
	good := saToken(t, key, "k1", testIssuer, testIssuer, exp)
	first, v := sa.verify(ctx, good, t0)
	if v != validServiceAccount {
		t.Fatalf("verdict %v, want valid", v)
	}
	again, v := sa.verify(ctx, good, t0.Add(time.Second))
	if v != validServiceAccount || again != first {
		t.Fatalf("verdict %v, user %p after %p: want the remembered user", v, again, first)
	}
	if _, v := sa.verify(ctx, good, exp.Add(time.Second)); v != notLocal {
		t.Fatalf("verdict %v past exp, want notLocal", v)
	}
	if _, v := sa.verify(ctx, good, t0.Add(-time.Hour)); v != notLocal {
		t.Fatalf("verdict %v before nbf, want notLocal", v)
	}

	// Same key set fetched again: still remembered.
	if err := sa.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if u, v := sa.verify(ctx, good, t0.Add(2*time.Second)); v != validServiceAccount || u != first {
		t.Fatalf("verdict %v after an unchanged refresh, want the remembered user", v)
	}
	// The key withdrawn: the token is verified again and is no one's.
	issuer.mu.Lock()
	issuer.keys.Keys = nil
	issuer.mu.Unlock()
	if err := sa.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, v := sa.verify(ctx, good, t0.Add(3*time.Second)); v != notLocal {
		t.Fatalf("verdict %v after its key was withdrawn, want notLocal", v)
	}
}
