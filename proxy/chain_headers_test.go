package proxy

import (
	"net/http"
	"testing"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
)

// Impersonation headers that kube-apiserver refuses with 400 are refused
// with 400 by the proxy too, instead of being charged to the caller.
func TestImpersonationWithoutUserIs400(t *testing.T) {
	px := newTestProxy(t, &enginetest.Engine{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, hs := range [][]string{
		{"Impersonate-Group", "dev"},
		{"Impersonate-Uid", "1234"},
		{"Impersonate-Extra-Scopes", "view"},
		{"Impersonate-User", "", "Impersonate-User", "bob", "Impersonate-Group", "dev"},
	} {
		resp, body := get(t, px, "agent", "/api/v1/pods?watch=true", hs...)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: HTTP %d %s, want 400", hs, resp.StatusCode, body)
		}
	}
}
