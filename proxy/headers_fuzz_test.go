package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"slices"
	"testing"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/request/websocket"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/filters/impersonation"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/authn"
	"github.com/watchgate/watchgate/proxy/internal/callertest"
	"github.com/watchgate/watchgate/proxy/internal/identity"
)

// FuzzCredentialHeaders checks the proxy's reading of the Authorization,
// WebSocket token and Impersonate-* headers against kube-apiserver's own
// code as the oracle: bearertoken.Authenticator, the WebSocket
// ProtocolAuthenticator, and the impersonation filter WithImpersonation
// (with an authorizer that allows everything, so that it builds the user it
// would serve the request as). The input is a raw header block, parsed as
// net/http's server parses it. Plain `go test` runs the seed corpus in
// testdata/fuzz/FuzzCredentialHeaders.
func FuzzCredentialHeaders(f *testing.F) {
	for _, seed := range []string{
		"Authorization: Bearer abc\r\n",
		"Authorization: Bearer  abc\r\n",
		"Authorization:   bEaReR abc def\r\n",
		"Authorization: Bearer abc\r\nAuthorization: Bearer def\r\n",
		"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Protocol: v4.channel.k8s.io, base64url.bearer.authorization.k8s.io.YWJj\r\n",
		"Upgrade: WebSocket\r\nConnection: keep-alive, upgrade\r\nSec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.YWJj\r\nSec-WebSocket-Protocol: x\r\n",
		"Authorization: Bearer abc\r\nImpersonate-User: bob\r\nImpersonate-Group: a\r\nImpersonate-Group: b\r\nImpersonate-Uid: 1\r\n",
		"Authorization: Bearer abc\r\nImpersonate-User: system:serviceaccount:ns:sa\r\nImpersonate-Extra-Scopes%2Fx: view\r\nimpersonate-extra-SCOPES%2fx: edit\r\n",
		"Authorization: Bearer abc\r\nImpersonate-Group: a\r\n",
		"Authorization: Bearer abc\r\nImpersonate-User: system:anonymous\r\nImpersonate-Group: system:unauthenticated\r\n",
		"Authorization: Bearer abc\r\nImpersonate-User:\r\nImpersonate-User: bob\r\n",
		"Authorization: Bearer abc\r\nImpersonate-User: bob\r\nImpersonate-Extra-%zz: v\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, block []byte) {
		if len(block) > 64<<10 {
			return
		}
		mh, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(block, "\r\n\r\n"...)))).ReadMIMEHeader()
		if err != nil {
			return // net/http's server refuses it too
		}
		h := http.Header(mh)

		// The token.
		got, gotErr := authn.RequestToken(h.Clone())
		bearer := kubeToken(bearertoken.New(captureToken()), h)
		ws := kubeToken(websocket.NewProtocolAuthenticator(captureToken()), h)
		switch {
		case errors.Is(gotErr, authn.ErrAmbiguousCredentials):
			// Refused with 400: nothing to compare.
		case gotErr != nil:
			if (bearer != "" && len(bearer) <= authn.MaxTokenBytes) || (bearer == "" && ws != "" && len(ws) <= authn.MaxTokenBytes) {
				t.Fatalf("proxy found no token; kube-apiserver would authenticate with %q / %q", bearer, ws)
			}
		case bearer != "":
			if got != bearer {
				t.Fatalf("proxy token %q, kube-apiserver bearer token %q", got, bearer)
			}
		default:
			if got != ws {
				t.Fatalf("proxy token %q, kube-apiserver WebSocket token %q", got, ws)
			}
		}

		// The impersonated user.
		target, impErr := identity.ImpersonationRequest(callertest.Alice, h.Clone())
		want, code := kubeImpersonation(h.Clone())
		switch {
		case code == http.StatusBadRequest:
			if impErr == nil {
				t.Fatalf("kube-apiserver answers 400, the proxy charges %v", target)
			}
		case code != http.StatusOK:
			t.Fatalf("kube-apiserver answered %d", code)
		case impErr != nil:
			t.Fatalf("proxy refuses (%v), kube-apiserver serves as %v", impErr, want)
		case want == nil:
			if target != nil {
				t.Fatalf("proxy charges %v, kube-apiserver serves the caller", target)
			}
		case target == nil:
			t.Fatalf("proxy charges the caller, kube-apiserver serves as %v", want)
		default:
			if target.GetName() != want.GetName() || target.GetUID() != want.GetUID() ||
				!slices.Equal(target.GetGroups(), want.GetGroups()) || !equalExtra(target.GetExtra(), want.GetExtra()) {
				t.Fatalf("proxy charges %#v, kube-apiserver serves as %#v", target, want)
			}
		}
	})
}

type capturedToken struct{ token string }

type capturedTokenKey struct{}

// captureToken is a token authenticator that records the token it is
// given in the context's capturedToken and refuses it (so the request is
// not changed).
func captureToken() authenticator.Token {
	return authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
		if c, ok := ctx.Value(capturedTokenKey{}).(*capturedToken); ok {
			c.token = token
		}
		return nil, false, nil
	})
}

// kubeToken is the token a's kube-apiserver request authenticator hands to
// its token authenticator, "" when none.
func kubeToken(a authenticator.Request, h http.Header) string {
	c := &capturedToken{}
	req := httptest.NewRequest(http.MethodGet, "/api", nil)
	req.Header = h.Clone()
	_, _, _ = a.AuthenticateRequest(req.WithContext(context.WithValue(req.Context(), capturedTokenKey{}, c)))
	return c.token
}

// kubeImpersonation runs kube-apiserver's impersonation filter for the
// caller alice with every impersonation allowed, and returns the user it
// serves the request as (nil: alice herself) and its HTTP code.
func kubeImpersonation(h http.Header) (user.Info, int) {
	allowAll := authorizer.AuthorizerFunc(func(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
		return authorizer.DecisionAllow, "", nil
	})
	var served user.Info
	handler := impersonation.WithImpersonation(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served, _ = request.UserFrom(r.Context())
	}), allowAll, answer.MetaCodecs)
	req := httptest.NewRequest(http.MethodGet, "/api", nil)
	req.Header = h
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req.WithContext(request.WithUser(req.Context(), callertest.Alice)))
	if served == callertest.Alice {
		served = nil
	}
	return served, rec.Code
}

func equalExtra(a, b map[string][]string) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return maps.EqualFunc(a, b, func(x, y []string) bool { return slices.Equal(x, y) })
}
