package authn

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/watchgate/watchgate/proxy/internal/callertest"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/review"
)

// The identity the proxy charges must be the one the API server serves:
// the Authorization header is split as kube-apiserver's bearertoken
// authenticator splits it, and a header that the proxy's own forwarding
// would drop (hop-by-hop, named in Connection) cannot decide who a request
// runs as.
func TestCredentialHeadersReadAsKubeAPIServerReadsThem(t *testing.T) {
	wsToken := "base64url.bearer.authorization.k8s.io." + base64.RawURLEncoding.EncodeToString([]byte("alice"))
	for name, tc := range map[string]struct {
		headers  []string
		wantCode int
		wantUser string
	}{
		"two spaces before the token is no token, as in kube-apiserver": {
			headers: []string{"Authorization", "Bearer  alice"}, wantCode: 401,
		},
		"a third field after the token is ignored, as in kube-apiserver": {
			headers: []string{"Authorization", "Bearer alice trailing"}, wantCode: 200, wantUser: "alice",
		},
		"surrounding spaces are trimmed": {
			headers: []string{"Authorization", "  Bearer alice  "}, wantCode: 200, wantUser: "alice",
		},
		"a tab is not the separator": {
			headers: []string{"Authorization", "Bearer\talice"}, wantCode: 401,
		},
		"the first of repeated Authorization headers counts": {
			headers: []string{"Authorization", "Bearer alice", "Authorization", "Bearer agent"}, wantCode: 200, wantUser: "alice",
		},
		"Connection naming Authorization would drop the token upstream": {
			headers: []string{"Authorization", "Bearer alice", "Connection", "keep-alive, authorization"}, wantCode: 400,
		},
		"Connection naming Impersonate-User would drop impersonation upstream": {
			headers: []string{"Authorization", "Bearer agent", "Impersonate-User", "bob", "Connection", "Impersonate-User"}, wantCode: 400,
		},
		"Connection naming an Impersonate-Extra header": {
			headers: []string{"Authorization", "Bearer agent", "Impersonate-User", "bob", "Impersonate-Extra-Scopes", "view", "Connection", "impersonate-extra-scopes"}, wantCode: 400,
		},
		"Connection naming Impersonate-Group, in a second Connection header": {
			headers: []string{"Authorization", "Bearer agent", "Connection", "close", "Connection", "Impersonate-Group"}, wantCode: 400,
		},
		"Connection naming Sec-WebSocket-Protocol would drop a WebSocket token": {
			headers: []string{"Upgrade", "websocket", "Connection", "Upgrade, Sec-WebSocket-Protocol", "Sec-WebSocket-Protocol", "v4.channel.k8s.io, " + wsToken}, wantCode: 400,
		},
		"Connection naming harmless headers is fine": {
			headers: []string{"Authorization", "Bearer alice", "Connection", "keep-alive, X-Whatever"}, wantCode: 200, wantUser: "alice",
		},
		"a bearer header and a WebSocket token could be served as either": {
			headers: []string{"Authorization", "Bearer agent", "Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Protocol", "v4.channel.k8s.io, " + wsToken}, wantCode: 400,
		},
		"a WebSocket token needs another subprotocol, as in kube-apiserver": {
			headers: []string{"Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Protocol", wsToken}, wantCode: 401,
		},
		"a WebSocket token needs Connection: Upgrade, as in kube-apiserver": {
			headers: []string{"Upgrade", "websocket", "Sec-WebSocket-Protocol", "v4.channel.k8s.io, " + wsToken}, wantCode: 401,
		},
		"two WebSocket tokens are refused, as in kube-apiserver": {
			headers: []string{"Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Protocol", "v4.channel.k8s.io, " + wsToken + ", " + wsToken}, wantCode: 401,
		},
		"a WebSocket token": {
			headers: []string{"Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Protocol", "v4.channel.k8s.io, " + wsToken}, wantCode: 200, wantUser: "alice",
		},
	} {
		t.Run(name, func(t *testing.T) {
			var got string
			h := WithAuthentication(callertest.Tokens, review.FailClosed, logtest.Discard(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				u, _ := request.CallerFrom(r.Context())
				got = u.GetName()
			}))
			req := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil)
			for i := 0; i+1 < len(tc.headers); i += 2 {
				req.Header.Add(tc.headers[i], tc.headers[i+1])
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.wantCode || got != tc.wantUser {
				t.Fatalf("HTTP %d, user %q; want %d, %q (%s)", rec.Code, got, tc.wantCode, tc.wantUser, rec.Body)
			}
		})
	}
}
