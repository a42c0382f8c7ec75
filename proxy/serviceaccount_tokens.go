package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	jose "gopkg.in/go-jose/go-jose.v2"
	"gopkg.in/go-jose/go-jose.v2/jwt"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	tokenjwt "k8s.io/apiserver/pkg/authentication/token/jwt"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
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
)

// serviceAccountTokens verifies service-account JWTs locally, as
// kube-apiserver's service-account authenticator does
// (k8s.io/kubernetes/pkg/serviceaccount/jwt.go), with go-jose, the JOSE
// library kube-apiserver itself uses: the signature against the public keys
// the API server publishes for its service-account issuer
// (/.well-known/openid-configuration and /openid/v1/jwks, fetched with the
// proxy's own client), then iss, aud, exp and nbf, then the
// kubernetes.io private claims.
//
// Local verification only chooses whose budget a request spends. The
// request is still forwarded with the caller's own token, and the API
// server authenticates it again, including the checks the proxy cannot
// make (the token's pod, secret or service account still exists with the
// same UID): a revoked token is charged locally and then refused upstream
// with 401.
//
// The key set is fetched at start, every refresh interval, and when a
// token names a key id the proxy does not know; those refreshes are rate
// limited (at most one per minRefresh), so random key ids cannot become a
// flood of requests. It is safe for concurrent use.
type serviceAccountTokens struct {
	client     rest.Interface
	audiences  []string // empty: the issuer itself, kube-apiserver's default --api-audiences
	clock      clock.PassiveClock
	unknownKid *rate.Limiter
	flights    singleflight.Group

	mu     sync.RWMutex
	issuer string
	keys   jose.JSONWebKeySet
}

// keyFetchTimeout bounds one fetch of the issuer and its keys; a request
// with an unknown key id may wait for it.
const keyFetchTimeout = 5 * time.Second

// minKeyRefresh is the shortest time between two key-set fetches caused by
// unknown key ids.
const minKeyRefresh = 10 * time.Second

func newServiceAccountTokens(client rest.Interface, audiences []string, clk clock.PassiveClock) *serviceAccountTokens {
	return &serviceAccountTokens{
		client: client, audiences: audiences, clock: clk,
		unknownKid: rate.NewLimiter(rate.Every(minKeyRefresh), 1),
	}
}

// run fetches the key set now and every interval until ctx ends.
func (s *serviceAccountTokens) run(ctx context.Context, interval time.Duration, log *sampledLogger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := s.refresh(ctx); err != nil && ctx.Err() == nil {
			log.Info("Cannot fetch the service-account issuer's keys; service-account tokens are reviewed", "err", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refresh fetches the issuer and its key set, one fetch at a time.
func (s *serviceAccountTokens) refresh(ctx context.Context) error {
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
		if err := json.Unmarshal(raw, &cfg); err != nil || cfg.Issuer == "" {
			keyRefreshes.WithLabelValues("error").Inc()
			return nil, fmt.Errorf("openid-configuration without issuer: %v", err)
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
		s.issuer, s.keys = cfg.Issuer, keys
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
		Namespace      string    `json:"namespace"`
		ServiceAccount claimRef  `json:"serviceaccount"`
		Pod            *claimRef `json:"pod,omitempty"`
		Secret         *claimRef `json:"secret,omitempty"`
		Node           *claimRef `json:"node,omitempty"`
	} `json:"kubernetes.io"`
}

type claimRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// verify tells whether token is a valid service-account token of the API
// server's issuer at now, and if so whose.
func (s *serviceAccountTokens) verify(ctx context.Context, token string, now time.Time) (user.Info, serviceAccountVerdict) {
	if strings.Count(token, ".") != 2 {
		return nil, notLocal
	}
	tok, err := jwt.ParseSigned(token)
	if err != nil || len(tok.Headers) != 1 {
		return nil, notLocal
	}
	var unverified jwt.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return nil, notLocal
	}
	s.mu.RLock()
	issuer := s.issuer
	s.mu.RUnlock()
	if issuer == "" || unverified.Issuer != issuer {
		return nil, notLocal
	}
	kid := tok.Headers[0].KeyID
	keys := s.keysFor(kid)
	if len(keys) == 0 && s.unknownKid.AllowN(now, 1) {
		_ = s.refresh(ctx)
		keys = s.keysFor(kid)
	}
	if len(keys) == 0 {
		return nil, notLocal
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
		return nil, forged
	}
	if public.ValidateWithLeeway(jwt.Expected{Issuer: issuer, Time: now}, 0) != nil {
		return nil, notLocal // let the API server's own leeway and errors decide
	}
	auds := s.audiences
	if len(auds) == 0 {
		auds = []string{issuer}
	}
	if !slices.ContainsFunc(auds, public.Audience.Contains) {
		return nil, notLocal
	}
	k := private.Kubernetes
	if k.Namespace == "" || k.ServiceAccount.Name == "" || k.ServiceAccount.UID == "" {
		return nil, notLocal
	}
	if public.Subject != serviceaccount.MakeUsername(k.Namespace, k.ServiceAccount.Name) {
		return nil, notLocal
	}
	info := serviceaccount.ServiceAccountInfo{Namespace: k.Namespace, Name: k.ServiceAccount.Name, UID: k.ServiceAccount.UID}
	if k.Pod != nil {
		info.PodName, info.PodUID = k.Pod.Name, k.Pod.UID
	}
	if k.Node != nil {
		info.NodeName, info.NodeUID = k.Node.Name, k.Node.UID
	}
	if public.ID != "" {
		info.CredentialID = tokenjwt.CredentialIDForJTI(public.ID)
	}
	u := info.UserInfo()
	d := &user.DefaultInfo{Name: u.GetName(), UID: u.GetUID(), Groups: append(slices.Clone(u.GetGroups()), user.AllAuthenticated), Extra: u.GetExtra()}
	return d, validServiceAccount
}

func (s *serviceAccountTokens) keysFor(kid string) []jose.JSONWebKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if kid == "" {
		return s.keys.Keys // kube-apiserver tries every key when there is no hint
	}
	return s.keys.Key(kid)
}
