package proxy

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
)

// maxTokenBytes bounds a bearer token; longer ones are rejected unreviewed.
const maxTokenBytes = 16 << 10

// withAuthentication admits only requests that carry a bearer token auth
// accepts, and leaves the caller's user.Info in the context. No token or a
// bad one gets 401 without forwarding; a token that could not be reviewed
// (reviews throttled, API server unreachable) gets 429 or 503 with
// Retry-After, which client-go retries. The Authorization header is left
// untouched: the API server checks the token again on the forwarded request.
func withAuthentication(auth authenticator.Token, log *sampledLogger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r.Header)
		if !ok {
			writeStatus(w, r, apierrors.NewUnauthorized("Unauthorized"))
			return
		}
		resp, ok, err := auth.AuthenticateToken(r.Context(), token)
		switch {
		case errors.Is(err, errReviewsThrottled):
			writeStatus(w, r, apierrors.NewTooManyRequests("too many new tokens to review, please try again later", 1))
			return
		case r.Context().Err() != nil:
			return // the client left
		case err != nil:
			log.Info("Cannot review token", "err", err.Error())
			writeStatus(w, r, serviceUnavailable("authentication is unavailable, please try again later"))
			return
		case !ok || resp == nil || resp.User == nil:
			writeStatus(w, r, apierrors.NewUnauthorized("Unauthorized"))
			return
		}
		next.ServeHTTP(w, r.WithContext(withCaller(r.Context(), resp.User)))
	})
}

// webSocketTokenPrefix marks the WebSocket subprotocol that carries a
// bearer token for browsers, which cannot set Authorization on a WebSocket
// (as kube-apiserver's pkg/authentication/request/websocket).
const webSocketTokenPrefix = "base64url.bearer.authorization.k8s.io."

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header or, for a WebSocket upgrade without one, of the
// base64url.bearer.authorization.k8s.io.<token> subprotocol. Both headers
// are forwarded unchanged.
func bearerToken(h http.Header) (string, bool) {
	var token string
	if scheme, t, ok := strings.Cut(strings.TrimSpace(h.Get("Authorization")), " "); ok && strings.EqualFold(scheme, "bearer") {
		token = strings.TrimSpace(t)
	} else if h.Get("Authorization") == "" && strings.EqualFold(h.Get("Upgrade"), "websocket") {
		token = webSocketToken(h.Values("Sec-WebSocket-Protocol"))
	}
	if token == "" || len(token) > maxTokenBytes {
		return "", false
	}
	return token, true
}

func webSocketToken(protocols []string) string {
	for _, list := range protocols {
		for _, p := range strings.Split(list, ",") {
			if enc, ok := strings.CutPrefix(strings.TrimSpace(p), webSocketTokenPrefix); ok {
				if raw, err := base64.RawURLEncoding.DecodeString(enc); err == nil {
					return string(raw)
				}
				return ""
			}
		}
	}
	return ""
}

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create

// tokenReviewer checks tokens with the TokenReview API, through the proxy's
// own client. The audiences are left empty: callers' tokens are meant for
// the API server, and the API server then checks them against its own.
func tokenReviewer(client authenticationv1client.TokenReviewInterface) authenticator.Token {
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

// cachedTokens wraps a token authenticator with a reviewCache. Tokens are
// keyed by HMAC-SHA256 with a random key, so the cache holds no token and
// its keys cannot be precomputed.
func cachedTokens(inner authenticator.Token, cache *reviewCache, ttl, negativeTTL time.Duration) authenticator.Token {
	hmacKey := make([]byte, 32)
	if _, err := rand.Read(hmacKey); err != nil {
		panic(err) // crypto/rand never fails
	}
	return authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
		mac := hmac.New(sha256.New, hmacKey)
		mac.Write([]byte(token))
		key := hex.EncodeToString(mac.Sum(nil))
		v, err := cache.get(ctx, key, func(ctx context.Context) (any, time.Duration, error) {
			resp, ok, err := inner.AuthenticateToken(ctx, token)
			switch {
			case err != nil:
				return nil, 0, err
			case !ok || resp == nil || resp.User == nil:
				return tokenAnswer{}, negativeTTL, nil
			default:
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
