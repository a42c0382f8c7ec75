package authn

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	jose "gopkg.in/go-jose/go-jose.v2"
	"gopkg.in/go-jose/go-jose.v2/jwt"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	tokenjwt "k8s.io/apiserver/pkg/authentication/token/jwt"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/internal/periodic"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
)

// serviceAccountVerdict is what local verification says about a token.
type serviceAccountVerdict int

const (
	// notLocal: not a JWT of the API server's service-account issuer
	// that the proxy can vouch for (another kind of token, another issuer,
	// an unknown key, a claim the proxy cannot check); TokenReview decides.
	notLocal serviceAccountVerdict = iota
	// validServiceAccount: signed by one of the issuer's keys, issuer,
	// audience, expiry and not-before checked.
	validServiceAccount
	// forged: a JWT naming the issuer and one of its key ids whose
	// signature does not verify with that key. kube-apiserver checks the
	// same signature with the same key, so it is 401 without a review.
	forged
	// revoked: a validly signed token whose service account, pod or node
	// no longer exists with the UID it names (boundObjects).
	// kube-apiserver refuses it too, so it is 401 without a review.
	revoked
)

// ServiceAccountTokens verifies service-account JWTs locally, as
// kube-apiserver's service-account authenticator does
// (k8s.io/kubernetes/pkg/serviceaccount/jwt.go), with go-jose, the JOSE
// library kube-apiserver itself uses: the signature against the public keys
// the API server publishes for its service-account issuer
// (/.well-known/openid-configuration and /openid/v1/jwks, fetched with the
// proxy's own client), then iss, aud, exp and nbf, then the
// kubernetes.io private claims.
//
// Then, as kube-apiserver's validator does, the objects the token names
// must still exist with the UIDs it names (bound, see boundObjects): its
// service account, and the pod or node it is bound to; a token whose pod
// was deleted is 401 without being charged. Tokens bound to a secret or a
// webhook configuration are left to a TokenReview: checking them locally
// would need to read every Secret, and they are rare.
//
// Local verification only chooses whose budget a request spends. The
// request is still forwarded with the caller's own token, and the API
// server authenticates it again.
//
// The key set is fetched at start, every refresh interval, and when a
// token that passes every check but the signature (plausible) names a key
// id the proxy does not know; those fetches are rate limited per client
// network and in all (minKeyRefresh), so random key ids cannot become a
// flood of requests nor use up the fetch a real rotation needs. It is
// safe for concurrent use.
type ServiceAccountTokens struct {
	client    rest.Interface
	audiences []string // empty: the issuer itself, kube-apiserver's default --api-audiences
	clock     clock.PassiveClock
	// unknownKid limits the key fetches caused by unknown key ids, per
	// client network and in all (see plausible).
	unknownKid *review.Budget
	flights    singleflight.Group
	// bound checks that a token's objects still exist; nil: not checked.
	bound *boundObjects

	mu     sync.RWMutex
	issuer string
	keys   jose.JSONWebKeySet
	// rawKeys is the key set as last fetched; generation counts the
	// changes of issuer or key set, so that a token verified with keys
	// that changed since is verified again.
	rawKeys    []byte
	generation atomic.Uint64

	// verified remembers tokens found valid (verifiedToken), keyed by
	// SHA-256 of cacheSalt and the token, so that it holds no token and
	// its keys cannot be precomputed; nil when off. A signature check
	// and a JSON decoding of the claims cost more than the forwarding of a
	// GET (~160 µs of the proxy's CPU per request in a profile).
	verified    *utilcache.LRUExpireCache
	verifiedTTL time.Duration
	cacheSalt   [32]byte
}

// verifiedToken is a token found valid: its user, the key-set generation
// it was verified with, and the time window in which its claims hold
// (nbf and iat at or before, exp at or after now; zero times: no bound).
type verifiedToken struct {
	user                 user.Info
	generation           uint64
	validFrom, validTill time.Time
	refs                 boundRefs
}

// boundRefs are the objects a valid token names that must still exist:
// its service account, and the pod or the node it is bound to (node only
// for a token bound to a node itself: a pod-bound token's node claims are
// only information, as for kube-apiserver).
type boundRefs struct {
	namespace      string
	serviceAccount claimRef
	pod, node      *claimRef
}

// keyFetchTimeout bounds one fetch of the issuer and its keys; a request
// with an unknown key id may wait for it.
const keyFetchTimeout = 5 * time.Second

// Key fetches caused by unknown key ids: at most one per minKeyRefresh
// for each client network, and keyRefreshesPerSecond in all, over at
// most keyRefreshRequesters networks (LRU). So a network that floods
// tokens with random key ids uses up only its own fetches, and a real
// rotation, seen from any other network, is fetched within a second.
const (
	minKeyRefresh         = 10 * time.Second
	keyRefreshesPerSecond = 1
	keyRefreshRequesters  = 1024
)

// NewServiceAccountTokens verifies tokens with the issuer's keys fetched
// through client, and their objects with bound (nil: not checked). Up to
// cacheSize tokens found valid are remembered for at most cacheTTL (never
// past their exp, never once the keys changed); cacheSize 0 remembers
// none. A remembered token's objects are checked again on every use
// (bound remembers those answers itself).
func NewServiceAccountTokens(client rest.Interface, audiences []string, clk clock.PassiveClock, cacheSize int, cacheTTL time.Duration, bound *boundObjects) *ServiceAccountTokens {
	s := &ServiceAccountTokens{
		client: client, audiences: audiences, clock: clk, bound: bound,
		unknownKid: review.NewBudget(keyRefreshesPerSecond, 1, float64(rate.Every(minKeyRefresh)), 1, keyRefreshRequesters),
	}
	if cacheSize > 0 && cacheTTL > 0 {
		s.verified = utilcache.NewLRUExpireCacheWithClock(cacheSize, clk)
		s.verifiedTTL = cacheTTL
		if _, err := rand.Read(s.cacheSalt[:]); err != nil {
			panic(err) // crypto/rand never fails
		}
	}
	return s
}

// Run fetches the key set now and every interval on clk until ctx ends.
func (s *ServiceAccountTokens) Run(ctx context.Context, clk clock.Clock, interval time.Duration, log *sampledlog.Logger) {
	periodic.NowAndEvery(ctx, clk, interval, func(ctx context.Context) {
		if err := s.refresh(ctx); err != nil && ctx.Err() == nil {
			log.Info("Cannot fetch the service-account issuer's keys; service-account tokens are reviewed", "err", err.Error())
		}
	})
}

// WatchBoundObjects watches the deletions of the objects tokens are bound
// to until ctx ends (see boundObjects.watchDeletions); it returns at once
// when they are not checked.
func (s *ServiceAccountTokens) WatchBoundObjects(ctx context.Context, log logr.Logger) {
	if s.bound != nil {
		s.bound.watchDeletions(ctx, log)
	}
}

// refresh fetches the issuer and its key set, one fetch at a time.
func (s *ServiceAccountTokens) refresh(ctx context.Context) error {
	_, err, _ := s.flights.Do("refresh", func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyFetchTimeout)
		defer cancel()
		raw, err := s.client.Get().AbsPath("/.well-known/openid-configuration").Do(fctx).Raw()
		if err != nil {
			keyRefreshes.WithLabelValues("error").Inc()
			return nil, fmt.Errorf("get openid-configuration: %w", err)
		}
		var cfg struct {
			Issuer string `json:"issuer"`
		}
		if err := json.Unmarshal(raw, &cfg); err != nil {
			keyRefreshes.WithLabelValues("error").Inc()
			return nil, fmt.Errorf("openid-configuration without issuer: %w", err)
		}
		if cfg.Issuer == "" {
			keyRefreshes.WithLabelValues("error").Inc()
			return nil, errors.New("openid-configuration without issuer")
		}
		// The API server serves its keys at this path whatever
		// jwks_uri says (which may name an external host).
		raw, err = s.client.Get().AbsPath("/openid/v1/jwks").Do(fctx).Raw()
		if err != nil {
			keyRefreshes.WithLabelValues("error").Inc()
			return nil, fmt.Errorf("get jwks: %w", err)
		}
		var keys jose.JSONWebKeySet
		if err := json.Unmarshal(raw, &keys); err != nil {
			keyRefreshes.WithLabelValues("error").Inc()
			return nil, fmt.Errorf("parse jwks: %w", err)
		}
		s.mu.Lock()
		if cfg.Issuer != s.issuer || !bytes.Equal(raw, s.rawKeys) {
			s.generation.Add(1)
		}
		s.issuer, s.keys, s.rawKeys = cfg.Issuer, keys, raw
		s.mu.Unlock()
		keyRefreshes.WithLabelValues("ok").Inc()
		return nil, nil
	})
	return err
}

// privateClaims are the kubernetes.io claims of a service-account token
// (k8s.io/kubernetes/pkg/serviceaccount/claims.go).
type privateClaims struct {
	Kubernetes struct {
		Namespace                      string    `json:"namespace"`
		ServiceAccount                 claimRef  `json:"serviceaccount"`
		Pod                            *claimRef `json:"pod,omitempty"`
		Secret                         *claimRef `json:"secret,omitempty"`
		Node                           *claimRef `json:"node,omitempty"`
		ValidatingWebhookConfiguration *claimRef `json:"validatingwebhookconfiguration,omitempty"`
		MutatingWebhookConfiguration   *claimRef `json:"mutatingwebhookconfiguration,omitempty"`
	} `json:"kubernetes.io"`
}

type claimRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// verify tells whether token is a valid service-account token of the API
// server's issuer at now, and if so whose. A token found valid before,
// with the same keys, whose claims hold at now, is not verified again.
func (s *ServiceAccountTokens) verify(ctx context.Context, token string, now time.Time) (user.Info, serviceAccountVerdict) {
	if strings.Count(token, ".") != 2 {
		return nil, notLocal
	}
	if s.verified == nil {
		u, verdict, e := s.verifyToken(ctx, token, now)
		if verdict != validServiceAccount {
			return u, verdict
		}
		return u, s.stillBound(ctx, e.refs, now)
	}
	h := sha256.New()
	h.Write(s.cacheSalt[:])
	h.Write([]byte(token))
	var key [sha256.Size]byte
	h.Sum(key[:0])
	if v, ok := s.verified.Get(key); ok {
		e := v.(verifiedToken)
		if e.generation == s.generation.Load() && !now.Before(e.validFrom) && (e.validTill.IsZero() || !now.After(e.validTill)) {
			return e.user, s.stillBound(ctx, e.refs, now)
		}
	}
	u, verdict, e := s.verifyToken(ctx, token, now)
	if verdict != validServiceAccount {
		return u, verdict
	}
	ttl := s.verifiedTTL
	if !e.validTill.IsZero() {
		ttl = min(ttl, e.validTill.Sub(now)+time.Second)
	}
	s.verified.Add(key, e, ttl)
	return u, s.stillBound(ctx, e.refs, now)
}

// stillBound checks, with s.bound, that the objects refs names still
// exist at now: validServiceAccount when they do, revoked when one does
// not, notLocal when the proxy cannot tell (a TokenReview decides).
func (s *ServiceAccountTokens) stillBound(ctx context.Context, refs boundRefs, now time.Time) serviceAccountVerdict {
	if s.bound == nil {
		return validServiceAccount
	}
	checks := [...]struct {
		resource, namespace string
		ref                 *claimRef
	}{
		{"serviceaccounts", refs.namespace, &refs.serviceAccount},
		{"pods", refs.namespace, refs.pod},
		{"nodes", "", refs.node},
	}
	for _, c := range checks {
		if c.ref == nil {
			continue
		}
		ok, err := s.bound.holds(ctx, objectRef{resource: c.resource, namespace: c.namespace, name: c.ref.Name}, c.ref.UID, now)
		switch {
		case err != nil:
			return notLocal
		case !ok:
			return revoked
		}
	}
	return validServiceAccount
}

// verifyToken is verify without the cache; for a valid token it also
// returns what the cache remembers of it.
func (s *ServiceAccountTokens) verifyToken(ctx context.Context, token string, now time.Time) (user.Info, serviceAccountVerdict, verifiedToken) {
	generation := s.generation.Load()
	u, verdict, public, refs := s.verifyClaims(ctx, token, now)
	if verdict != validServiceAccount {
		return u, verdict, verifiedToken{}
	}
	e := verifiedToken{user: u, generation: generation, refs: refs}
	if public.NotBefore != nil {
		e.validFrom = public.NotBefore.Time()
	}
	if public.IssuedAt != nil && public.IssuedAt.Time().After(e.validFrom) {
		e.validFrom = public.IssuedAt.Time()
	}
	if public.Expiry != nil {
		e.validTill = public.Expiry.Time()
	}
	return u, verdict, e
}

// verifyClaims checks token's signature and claims; for a valid token it
// also returns its registered claims.
func (s *ServiceAccountTokens) verifyClaims(ctx context.Context, token string, now time.Time) (user.Info, serviceAccountVerdict, *jwt.Claims, boundRefs) {
	tok, err := jwt.ParseSigned(token)
	if err != nil || len(tok.Headers) != 1 {
		return nil, notLocal, nil, boundRefs{}
	}
	var unverified jwt.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return nil, notLocal, nil, boundRefs{}
	}
	s.mu.RLock()
	issuer := s.issuer
	s.mu.RUnlock()
	if issuer == "" || unverified.Issuer != issuer {
		return nil, notLocal, nil, boundRefs{}
	}
	kid := tok.Headers[0].KeyID
	keys := s.keysFor(kid)
	if len(keys) == 0 && s.plausible(&unverified, tok, issuer, now) && s.unknownKid.Allow(review.RequesterFrom(ctx), review.LaneNew, now) {
		_ = s.refresh(ctx)
		keys = s.keysFor(kid)
	}
	if len(keys) == 0 {
		return nil, notLocal, nil, boundRefs{}
	}
	var public jwt.Claims
	var private privateClaims
	verified := false
	for _, k := range keys {
		if tok.Claims(k.Key, &public, &private) == nil {
			verified = true
			break
		}
	}
	if !verified {
		return nil, forged, nil, boundRefs{}
	}
	if public.ValidateWithLeeway(jwt.Expected{Issuer: issuer, Time: now}, 0) != nil {
		return nil, notLocal, nil, boundRefs{} // let the API server's own leeway and errors decide
	}
	auds := s.audiences
	if len(auds) == 0 {
		auds = []string{issuer}
	}
	if !slices.ContainsFunc(auds, public.Audience.Contains) {
		return nil, notLocal, nil, boundRefs{}
	}
	k := private.Kubernetes
	if k.Namespace == "" || k.ServiceAccount.Name == "" || k.ServiceAccount.UID == "" {
		return nil, notLocal, nil, boundRefs{}
	}
	if public.Subject != serviceaccount.MakeUsername(k.Namespace, k.ServiceAccount.Name) {
		return nil, notLocal, nil, boundRefs{}
	}
	if k.Secret != nil || k.ValidatingWebhookConfiguration != nil || k.MutatingWebhookConfiguration != nil {
		return nil, notLocal, nil, boundRefs{} // see serviceAccountTokens
	}
	refs := boundRefs{namespace: k.Namespace, serviceAccount: k.ServiceAccount, pod: k.Pod}
	info := serviceaccount.ServiceAccountInfo{Namespace: k.Namespace, Name: k.ServiceAccount.Name, UID: k.ServiceAccount.UID}
	if k.Pod != nil {
		info.PodName, info.PodUID = k.Pod.Name, k.Pod.UID
	}
	if k.Node != nil {
		info.NodeName, info.NodeUID = k.Node.Name, k.Node.UID
		if k.Pod == nil {
			refs.node = k.Node
		}
	}
	if public.ID != "" {
		info.CredentialID = tokenjwt.CredentialIDForJTI(public.ID)
	}
	u := info.UserInfo()
	d := &user.DefaultInfo{Name: u.GetName(), UID: u.GetUID(), Groups: append(slices.Clone(u.GetGroups()), user.AllAuthenticated), Extra: u.GetExtra()}
	return d, validServiceAccount, &public, refs
}

// plausible reports whether a token whose key is unknown passes every
// check that needs no key — issuer, expiry and not-before, audience, and a
// subject that is the service account its private claims name — so that
// only such tokens may cause a key fetch: a made-up key id on a token the
// proxy would not accept anyway fetches nothing.
func (s *ServiceAccountTokens) plausible(public *jwt.Claims, tok *jwt.JSONWebToken, issuer string, now time.Time) bool {
	if public.ValidateWithLeeway(jwt.Expected{Issuer: issuer, Time: now}, 0) != nil {
		return false
	}
	auds := s.audiences
	if len(auds) == 0 {
		auds = []string{issuer}
	}
	if !slices.ContainsFunc(auds, public.Audience.Contains) {
		return false
	}
	var private privateClaims
	if tok.UnsafeClaimsWithoutVerification(&private) != nil {
		return false
	}
	k := private.Kubernetes
	return k.Namespace != "" && k.ServiceAccount.Name != "" && k.ServiceAccount.UID != "" &&
		public.Subject == serviceaccount.MakeUsername(k.Namespace, k.ServiceAccount.Name)
}

func (s *ServiceAccountTokens) keysFor(kid string) []jose.JSONWebKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if kid == "" {
		return s.keys.Keys // kube-apiserver tries every key when there is no hint
	}
	return s.keys.Key(kid)
}
