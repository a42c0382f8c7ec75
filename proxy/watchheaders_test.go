package proxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A watch's 200 goes out with WriteHeader; other answers wait for their
// body, as the reverse proxy sends them.
func TestWatchHeadersFlushA200AtOnce(t *testing.T) {
	for code, wantFlushed := range map[int]bool{http.StatusOK: true, http.StatusForbidden: false, http.StatusGone: false} {
		rec := httptest.NewRecorder()
		watchHeaders{rec}.WriteHeader(code)
		if rec.Flushed != wantFlushed {
			t.Errorf("%d: flushed %v, want %v", code, rec.Flushed, wantFlushed)
		}
		if rec.Code != code {
			t.Errorf("%d: recorded %d", code, rec.Code)
		}
	}
	if u := (watchHeaders{httptest.NewRecorder()}).Unwrap(); u == nil {
		t.Error("Unwrap returned nil")
	}
}
