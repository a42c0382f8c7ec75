package relay

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
	rec := httptest.NewRecorder()
	if err := http.NewResponseController(watchHeaders{rec}).Flush(); err != nil || !rec.Flushed {
		t.Errorf("a flush through the wrapper: %v, flushed %v", err, rec.Flushed)
	}
	if u := (watchHeaders{rec}).Unwrap(); u != rec {
		t.Error("Unwrap does not return the wrapped writer")
	}
}

// BenchmarkWatchHeadersFlush is the reverse proxy's flush after every
// write of a stream, through the wrapper (found by Unwrap) and straight on
// the writer: the wrapper costs ~2 ns per event (6.4 against 4.3 ns/op
// here on 2026-12-03; a FlushError method of its own made it 7.2).
//
//	go test -run '^$' -bench BenchmarkWatchHeadersFlush ./proxy/
func BenchmarkWatchHeadersFlush(b *testing.B) {
	for name, w := range map[string]http.ResponseWriter{"direct": httptest.NewRecorder(), "watchHeaders": watchHeaders{httptest.NewRecorder()}} {
		b.Run(name, func(b *testing.B) {
			flush := http.NewResponseController(w).Flush
			for b.Loop() {
				_ = flush()
			}
		})
	}
}
