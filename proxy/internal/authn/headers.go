package authn

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/textproto"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/streaming/pkg/httpstream"
)

// The credentials of a request are read here exactly as kube-apiserver
// reads them, so that the identity the proxy charges is the identity the
// API server serves (k8s.io/apiserver/pkg/authentication/request/bearertoken
// and .../request/websocket; FuzzCredentialHeaders checks this against
// those packages).

// ErrAmbiguousCredentials means the API server could serve the request as
// someone other than the proxy would charge; the client gets 400.
var ErrAmbiguousCredentials = errors.New("ambiguous credentials")

// errNoToken means the request carries no usable bearer token; 401.
var errNoToken = errors.New("no bearer token")

// webSocketTokenPrefix marks the WebSocket subprotocol that carries a
// bearer token for browsers, which cannot set Authorization on a WebSocket.
const webSocketTokenPrefix = "base64url.bearer.authorization.k8s.io."

var webSocketProtocolHeader = textproto.CanonicalMIMEHeaderKey("Sec-WebSocket-Protocol")

// RequestToken returns the bearer token kube-apiserver would authenticate
// the request with:
//
//   - "Authorization: Bearer <token>": the header trimmed, split on single
//     spaces into at most three fields, the scheme case-insensitive, the
//     second field the token (so "Bearer  t" has none and "Bearer t x" is
//     t); only the first Authorization header counts.
//   - otherwise, on a WebSocket request (Upgrade: websocket and a
//     Connection header containing "upgrade"), the one
//     base64url.bearer.authorization.k8s.io.<base64url token> subprotocol,
//     valid UTF-8, beside at least one other subprotocol.
//
// kube-apiserver tries the WebSocket token when the bearer token fails, so
// a request carrying both could be served as either: errAmbiguousCredentials.
// So is a request whose Connection header names a credential header (see
// hopByHopCredentials). Tokens longer than maxTokenBytes are no token.
func RequestToken(h http.Header) (string, error) {
	if hopByHopCredentials(h) {
		return "", ErrAmbiguousCredentials
	}
	bearer := authorizationToken(h)
	ws, wsErr := webSocketToken(h)
	switch {
	case bearer != "" && (ws != "" || wsErr != nil):
		return "", ErrAmbiguousCredentials
	case bearer != "":
		return boundToken(bearer)
	case wsErr != nil:
		return "", errNoToken
	case ws != "" && !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade"):
		// kube-apiserver finds "upgrade" anywhere in Connection;
		// ReverseProxy forwards Upgrade only for the exact token.
		return "", ErrAmbiguousCredentials
	default:
		return boundToken(ws)
	}
}

func boundToken(t string) (string, error) {
	if t == "" || len(t) > MaxTokenBytes {
		return "", errNoToken
	}
	return t, nil
}

// authorizationToken is bearertoken.Authenticator's parsing.
func authorizationToken(h http.Header) string {
	auth := strings.TrimSpace(h.Get("Authorization"))
	if auth == "" {
		return ""
	}
	parts := strings.SplitN(auth, " ", 3)
	if len(parts) < 2 || strings.ToLower(parts[0]) != "bearer" {
		return ""
	}
	return parts[1]
}

// webSocketToken is websocket.ProtocolAuthenticator's parsing: "" and no
// error when there is no token; an error where kube-apiserver fails the
// request's WebSocket authentication.
func webSocketToken(h http.Header) (string, error) {
	// k8s.io/streaming's wsstream.IsWebSocketRequest.
	if !strings.EqualFold(h.Get("Upgrade"), "websocket") || !httpstream.IsUpgradeRequest(&http.Request{Header: h}) {
		return "", nil
	}
	token, saw, others := "", false, 0
	for _, list := range h[webSocketProtocolHeader] {
		for _, p := range strings.Split(list, ",") {
			p = strings.TrimSpace(p)
			enc, ok := strings.CutPrefix(p, webSocketTokenPrefix)
			if !ok {
				others++
				continue
			}
			if saw {
				return "", errors.New("multiple bearer token subprotocols")
			}
			saw = true
			raw, err := base64.RawURLEncoding.DecodeString(enc)
			if err != nil || !utf8.Valid(raw) {
				return "", errors.New("invalid bearer token subprotocol")
			}
			token = string(raw)
		}
	}
	if token != "" && others == 0 {
		return "", errors.New("missing additional subprotocol")
	}
	return token, nil
}

// hopByHopCredentials reports whether a Connection header names a header
// that decides who the request runs as. httputil.ReverseProxy drops every
// header named in Connection before forwarding (RFC 9110 §7.6.1), so the
// proxy would see a token or an impersonation the API server never gets.
// (HTTP/2 requests cannot carry Connection at all.)
func hopByHopCredentials(h http.Header) bool {
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if credentialHeader(textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))) {
				return true
			}
		}
	}
	return false
}

// credentialHeader reports whether the canonical header name takes part in
// deciding the identity kube-apiserver serves a request as.
func credentialHeader(name string) bool {
	switch name {
	case "Authorization", webSocketProtocolHeader,
		authenticationv1.ImpersonateUserHeader, authenticationv1.ImpersonateGroupHeader, authenticationv1.ImpersonateUIDHeader:
		return true
	}
	return strings.HasPrefix(name, authenticationv1.ImpersonateUserExtraHeaderPrefix)
}
