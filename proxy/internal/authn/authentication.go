package authn

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
)

// MaxTokenBytes bounds a bearer token; longer ones are rejected unreviewed.
// Service-account tokens are about 1 KiB, OIDC tokens a few KiB.
const MaxTokenBytes = 16 << 10

// WithAuthentication admits only requests that carry a bearer token auth
// accepts, and leaves the caller's user.Info in the context. The token is
// read as kube-apiserver reads it (RequestToken); credentials the proxy
// and the API server could read differently get 400. No token or a bad
// one gets 401 without forwarding; a token that could not be reviewed
// because reviews are throttled gets 429, because the review failed 503,
// both with Retry-After, which client-go retries (or, with FailOpen, the
// request is forwarded, charged to review.UnreviewedCaller). The client's network
// (clientPrefix) is the requester whose review budget a TokenReview
// spends. The Authorization
// header is left untouched: the API server checks the token again on the
// forwarded request.
func WithAuthentication(auth authenticator.Token, policy review.FailurePolicy, log *sampledlog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, err := RequestToken(r.Header)
		switch {
		case errors.Is(err, ErrAmbiguousCredentials):
			credentialsRefused.WithLabelValues("ambiguous").Inc()
			answer.WriteStatus(w, r, apierrors.NewBadRequest("the request's credential headers could be read in more than one way "+
				"(a bearer token and a WebSocket token, or a Connection header naming a credential header)"))
			return
		case err != nil:
			answer.WriteStatus(w, r, apierrors.NewUnauthorized("Unauthorized"))
			return
		}
		ctx := review.WithRequesterOf(r.Context(), clientPrefix(r.RemoteAddr))
		resp, ok, err := auth.AuthenticateToken(ctx, token)
		switch {
		case err != nil:
			if policy.Failed(w, r, review.Token, err, log) {
				// Forwarded, charged: a watch it opens must not be
				// cut as an unauthenticated connection's.
				connectionAuthenticated(r.Context())
				st, r := request.StateOf(r)
				st.Caller = review.UnreviewedCaller(token)
				next.ServeHTTP(w, r)
			}
			return
		case !ok || resp == nil || resp.User == nil:
			answer.WriteStatus(w, r, apierrors.NewUnauthorized("Unauthorized"))
			return
		}
		connectionAuthenticated(r.Context())
		st, r := request.StateOf(r)
		st.Caller = resp.User
		next.ServeHTTP(w, r)
	})
}

// clientPrefix works out the network the request from remoteAddr came
// from, the requester of its TokenReviews: the client address's IPv4 /24
// or IPv6 /64, so that the addresses of one network (pods of a node,
// clients behind one SNAT, an IPv6 /64 handed to one host) share one
// review bucket rather than take one each. Forwarding headers are not
// trusted. The key is at most a prefix's text, whatever RemoteAddr holds.
// It is worked out only when a review or a lookup spends budget
// (review.WithRequesterOf), not for the requests a cache answers.
func clientPrefix(remoteAddr string) func() string {
	return func() string { return NetworkOf(remoteAddr) }
}

// NetworkOf is the IPv4 /24 or IPv6 /64 of remoteAddr (host:port, or a
// bare address); at most 64 bytes of it when it is not an IP address.
func NetworkOf(remoteAddr string) string {
	host := remoteAddr
	if h, _, err := net.SplitHostPort(remoteAddr); err == nil {
		host = h
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		if len(host) > 64 {
			host = host[:64]
		}
		return host
	}
	addr = addr.Unmap()
	bits := 64
	if addr.Is4() {
		bits = 24
	}
	p, _ := addr.WithZone("").Prefix(bits)
	return p.String()
}

// validLocalVerifications is looked up once: nearly every request of a
// service account counts there.
var validLocalVerifications = localVerifications.WithLabelValues("valid")

// verdictLabels are the metric labels of the verdicts that refuse a token.
var verdictLabels = map[serviceAccountVerdict]string{forged: "forged", revoked: "revoked"}

// LocalThenReviewed verifies service-account tokens locally (local may be
// nil) and hands every other token to reviewed: a validly signed
// service-account token needs no TokenReview, and a forged or revoked one
// is 401 without one.
func LocalThenReviewed(local *ServiceAccountTokens, reviewed authenticator.Token, clk clock.PassiveClock) authenticator.Token {
	return authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
		if local != nil {
			u, verdict := local.verify(ctx, token, clk.Now())
			switch verdict {
			case validServiceAccount:
				validLocalVerifications.Inc()
				return &authenticator.Response{User: u}, true, nil
			case forged, revoked:
				localVerifications.WithLabelValues(verdictLabels[verdict]).Inc()
				return nil, false, nil
			}
			localVerifications.WithLabelValues("reviewed").Inc()
		}
		return reviewed.AuthenticateToken(ctx, token)
	})
}

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create

// TokenReviewer checks tokens with the TokenReview API, through the proxy's
// own client. The audiences are left empty: callers' tokens are meant for
// the API server, and the API server then checks them against its own.
func TokenReviewer(client authenticationv1client.TokenReviewInterface) authenticator.Token {
	return authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
		tr, err := client.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err != nil {
			return nil, false, fmt.Errorf("create TokenReview: %w", err)
		}
		if !tr.Status.Authenticated {
			return nil, false, nil
		}
		u := tr.Status.User
		var extra map[string][]string
		if len(u.Extra) > 0 {
			extra = make(map[string][]string, len(u.Extra))
			for k, v := range u.Extra {
				extra[k] = v
			}
		}
		return &authenticator.Response{User: &user.DefaultInfo{Name: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra}}, true, nil
	})
}

// tokenAnswer is what the token cache remembers: a user, or nil for a
// rejected token.
type tokenAnswer struct{ user user.Info }

// Tokens found valid within recentTokensTTL revalidate through a reserved
// review bucket of recentTokensShare of ReviewsPerSecond and ReviewBurst,
// on top of the shared one: a caller whose token was valid half an hour
// ago is all but certainly the same caller, and a flood of unknown tokens
// must not keep it out when its cached answer expires.
const (
	RecentTokensTTL   = 30 * time.Minute
	RecentTokensShare = 0.25
)

// CachedTokens wraps a token authenticator with a review.Cache. Tokens are
// keyed by HMAC-SHA256 with a random key, so the cache holds no token and
// its keys cannot be precomputed. Tokens found valid are also remembered
// in recent (by key, for recentTTL, bounded in count; nil: none): when
// such a token's answer has expired from the cache, its new review takes
// LaneRecent, the review budget a flood of unknown tokens cannot spend.
func CachedTokens(inner authenticator.Token, cache *review.Cache, recent *utilcache.LRUExpireCache, ttl, negativeTTL, recentTTL time.Duration) authenticator.Token {
	hmacKey := make([]byte, 32)
	if _, err := rand.Read(hmacKey); err != nil {
		panic(err) // crypto/rand never fails
	}
	return authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
		mac := hmac.New(sha256.New, hmacKey)
		mac.Write([]byte(token))
		var sum [sha256.Size]byte
		key := string(mac.Sum(sum[:0]))
		lane := review.LaneNew
		if recent != nil {
			if _, ok := recent.Get(key); ok {
				lane = review.LaneRecent
			}
		}
		v, err := cache.GetAsContextRequester(ctx, key, lane, func(ctx context.Context) (any, time.Duration, error) {
			resp, ok, err := inner.AuthenticateToken(ctx, token)
			switch {
			case err != nil:
				return nil, 0, err
			case !ok || resp == nil || resp.User == nil:
				if recent != nil {
					recent.Remove(key)
				}
				return tokenAnswer{}, negativeTTL, nil
			default:
				if recent != nil {
					recent.Add(key, struct{}{}, recentTTL)
				}
				return tokenAnswer{user: resp.User}, ttl, nil
			}
		})
		if err != nil {
			return nil, false, err
		}
		a := v.(tokenAnswer)
		if a.user == nil {
			return nil, false, nil
		}
		return &authenticator.Response{User: a.user}, true, nil
	})
}
