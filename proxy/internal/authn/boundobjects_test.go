package authn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	jose "gopkg.in/go-jose/go-jose.v2"
	"gopkg.in/go-jose/go-jose.v2/jwt"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metadatafake "k8s.io/client-go/metadata/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/review"
)

// A validly signed token is valid only while the objects it names exist
// with the UIDs it names, as kube-apiserver's validator decides: the
// service account, the pod, or the node of a node-bound token.
func TestTokensOfObjectsThatAreGoneAreRevoked(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	objects := map[string]metav1.ObjectMeta{
		"serviceaccounts/agents/agent":  {UID: "sa-uid"},
		"pods/agents/agent-0":           {UID: "pod-uid"},
		"pods/agents/leaving":           {UID: "leaving-uid", DeletionTimestamp: &metav1.Time{Time: t0.Add(-10 * time.Second)}},
		"pods/agents/gone-a-while":      {UID: "gone-uid", DeletionTimestamp: &metav1.Time{Time: t0.Add(-2 * time.Minute)}},
		"nodes//node-1":                 {UID: "node-uid"},
		"serviceaccounts/agents/broken": {},
		"serviceaccounts/agents/other":  {UID: "other-uid"},
	}
	meta := metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme())
	meta.PrependReactor("get", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		g := a.(clienttesting.GetAction)
		key := g.GetResource().Resource + "/" + g.GetNamespace() + "/" + g.GetName()
		if g.GetName() == "broken" {
			return true, nil, errors.New("the API server is unreachable")
		}
		m, ok := objects[key]
		if !ok {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: g.GetResource().Resource}, g.GetName())
		}
		m.Name, m.Namespace = g.GetName(), g.GetNamespace()
		return true, &metav1.PartialObjectMetadata{ObjectMeta: m}, nil
	})

	issuer := &testIssuerServer{}
	key := newKey(t)
	issuer.publish("k1", key)
	sa := verifierOf(t, issuer, clk, time.Minute, NewBoundObjects(meta, 100, time.Minute, 10*time.Second, time.Second, nil, clk))
	sign := func(saName, saUID string, pod, node, secret, webhook *claimRef) string {
		sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
		if err != nil {
			t.Fatal(err)
		}
		var p privateClaims
		p.Kubernetes.Namespace = "agents"
		p.Kubernetes.ServiceAccount = claimRef{Name: saName, UID: saUID}
		p.Kubernetes.Pod, p.Kubernetes.Node, p.Kubernetes.Secret, p.Kubernetes.ValidatingWebhookConfiguration = pod, node, secret, webhook
		tok, err := jwt.Signed(sig).Claims(jwt.Claims{
			Issuer: testIssuer, Subject: "system:serviceaccount:agents:" + saName, Audience: jwt.Audience{testIssuer},
			Expiry: jwt.NewNumericDate(t0.Add(time.Hour)), NotBefore: jwt.NewNumericDate(t0.Add(-time.Hour)), IssuedAt: jwt.NewNumericDate(t0.Add(-time.Hour)),
		}).Claims(p).CompactSerialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ref := func(name, uid string) *claimRef { return &claimRef{Name: name, UID: uid} }
	for name, tc := range map[string]struct {
		token string
		want  serviceAccountVerdict
	}{
		"bound to its pod, both there":                           {sign("agent", "sa-uid", ref("agent-0", "pod-uid"), nil, nil, nil), validServiceAccount},
		"not bound, its service account there":                   {sign("agent", "sa-uid", nil, nil, nil, nil), validServiceAccount},
		"its service account recreated (another UID)":            {sign("agent", "old-sa-uid", nil, nil, nil, nil), revoked},
		"its service account deleted":                            {sign("deleted", "x", nil, nil, nil, nil), revoked},
		"its pod deleted":                                        {sign("agent", "sa-uid", ref("agent-1", "x"), nil, nil, nil), revoked},
		"its pod recreated (another UID)":                        {sign("agent", "sa-uid", ref("agent-0", "old-pod-uid"), nil, nil, nil), revoked},
		"its pod being deleted within the leeway":                {sign("agent", "sa-uid", ref("leaving", "leaving-uid"), nil, nil, nil), validServiceAccount},
		"its pod being deleted for longer than the leeway":       {sign("agent", "sa-uid", ref("gone-a-while", "gone-uid"), nil, nil, nil), revoked},
		"bound to its node, there":                               {sign("agent", "sa-uid", nil, ref("node-1", "node-uid"), nil, nil), validServiceAccount},
		"bound to a node that is gone":                           {sign("agent", "sa-uid", nil, ref("node-2", "x"), nil, nil), revoked},
		"bound to a node recreated (another UID)":                {sign("agent", "sa-uid", nil, ref("node-1", "old"), nil, nil), revoked},
		"bound to a pod, whose node claims are only information": {sign("agent", "sa-uid", ref("agent-0", "pod-uid"), ref("node-2", "x"), nil, nil), validServiceAccount},
		"bound to a secret: reviewed":                            {sign("agent", "sa-uid", nil, nil, ref("s", "u"), nil), notLocal},
		"bound to a webhook configuration: reviewed":             {sign("agent", "sa-uid", nil, nil, nil, ref("w", "u")), notLocal},
		"its service account cannot be read: reviewed":           {sign("broken", "x", nil, nil, nil, nil), notLocal},
		"another service account's UID":                          {sign("other", "sa-uid", nil, nil, nil, nil), revoked},
	} {
		t.Run(name, func(t *testing.T) {
			for range 2 { // verified, then from the cache of verified tokens
				if _, v := sa.verify(context.Background(), tc.token, t0); v != tc.want {
					t.Fatalf("verdict %v, want %v", v, tc.want)
				}
			}
		})
	}

	t.Run("a pod deleted after its token was verified is noticed once its answer expires", func(t *testing.T) {
		objects["pods/agents/short-lived"] = metav1.ObjectMeta{UID: types.UID("short-uid")}
		tok := sign("agent", "sa-uid", ref("short-lived", "short-uid"), nil, nil, nil)
		if _, v := sa.verify(context.Background(), tok, clk.Now()); v != validServiceAccount {
			t.Fatalf("verdict %v with the pod, want valid", v)
		}
		delete(objects, "pods/agents/short-lived")
		if _, v := sa.verify(context.Background(), tok, clk.Now()); v != validServiceAccount {
			t.Fatalf("verdict %v within the answer's TTL, want valid (remembered)", v)
		}
		clk.Step(time.Minute + time.Second)
		if _, v := sa.verify(context.Background(), tok, clk.Now()); v != revoked {
			t.Fatalf("verdict %v once the answer expired, want revoked", v)
		}
	})

	t.Run("an object found is trusted at most MaxFoundTTL, however long the token cache's TTL", func(t *testing.T) {
		long := verifierOf(t, issuer, clk, 2*time.Minute, NewBoundObjects(meta, 100, 2*time.Minute, 10*time.Second, time.Second, nil, clk))
		objects["pods/agents/brief"] = metav1.ObjectMeta{UID: types.UID("brief-uid")}
		tok := sign("agent", "sa-uid", ref("brief", "brief-uid"), nil, nil, nil)
		if _, v := long.verify(context.Background(), tok, clk.Now()); v != validServiceAccount {
			t.Fatalf("verdict %v with the pod, want valid", v)
		}
		delete(objects, "pods/agents/brief")
		clk.Step(MaxFoundTTL + time.Second)
		if _, v := long.verify(context.Background(), tok, clk.Now()); v != revoked {
			t.Fatalf("verdict %v %v after the deletion, want revoked", v, MaxFoundTTL+time.Second)
		}
	})

	t.Run("lookups are bounded per client network", func(t *testing.T) {
		budget := review.NewBudget(1000, 1000, 0.001, 3, 16)
		bounded := verifierOf(t, issuer, clk, time.Minute, NewBoundObjects(meta, 100, time.Minute, 10*time.Second, time.Second, budget, clk))
		flooded := review.WithRequester(context.Background(), "10.0.0.0/24")
		var verdicts []serviceAccountVerdict
		for i := range 5 { // the service account's lookup, then four pods'
			tok := sign("agent", "sa-uid", ref(fmt.Sprint("never-", i), "x"), nil, nil, nil)
			_, v := bounded.verify(flooded, tok, clk.Now())
			verdicts = append(verdicts, v)
		}
		if want := []serviceAccountVerdict{revoked, revoked, notLocal, notLocal, notLocal}; !slices.Equal(verdicts, want) {
			t.Errorf("verdicts from the flooded network: %v, want %v (its burst of 3 lookups, then reviewed)", verdicts, want)
		}
		other := review.WithRequester(context.Background(), "10.0.1.0/24")
		if _, v := bounded.verify(other, sign("agent", "sa-uid", ref("never-9", "x"), nil, nil, nil), clk.Now()); v != revoked {
			t.Errorf("verdict from another network: %v, want revoked (looked up)", v)
		}
	})

	t.Run("looking again at objects found before spends no budget", func(t *testing.T) {
		budget := review.NewBudget(1000, 1000, 0.001, 2, 16)
		bounded := verifierOf(t, issuer, clk, time.Minute, NewBoundObjects(meta, 100, time.Minute, 10*time.Second, time.Second, budget, clk))
		node := review.WithRequester(context.Background(), "10.0.2.0/24")
		tok := sign("agent", "sa-uid", ref("agent-0", "pod-uid"), nil, nil, nil)
		for i := range 5 { // the service account and the pod, then looked at again every MaxFoundTTL
			if _, v := bounded.verify(node, tok, clk.Now()); v != validServiceAccount {
				t.Fatalf("verdict %v at the %d-th look, want valid", v, i)
			}
			clk.Step(MaxFoundTTL + time.Second)
		}
	})
}

// BenchmarkVerifyRememberedToken measures a request's local verification
// of a token verified before: the cache of verified tokens, then (with
// bound) the remembered answers for its service account and pod.
func BenchmarkVerifyRememberedToken(b *testing.B) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	meta := metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme())
	meta.PrependReactor("get", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		uid := map[string]types.UID{"serviceaccounts": "uid-1", "pods": "pod-uid"}[a.GetResource().Resource]
		return true, &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{UID: uid}}, nil
	})
	key := newKey(b)
	for name, bound := range map[string]*boundObjects{
		"unchecked": nil,
		"bound":     NewBoundObjects(meta, 100, time.Hour, time.Hour, time.Second, nil, clk),
	} {
		b.Run(name, func(b *testing.B) {
			issuer := &testIssuerServer{}
			issuer.publish("k1", key)
			sa := verifierOf(b, issuer, clk, time.Hour, bound)
			tok := saToken(b, key, "k1", testIssuer, testIssuer, t0.Add(time.Hour))
			ctx := context.Background()
			if _, v := sa.verify(ctx, tok, t0); v != validServiceAccount {
				b.Fatalf("verdict %v", v)
			}
			b.ReportAllocs()
			for b.Loop() {
				sa.verify(ctx, tok, t0)
			}
		})
	}
}
