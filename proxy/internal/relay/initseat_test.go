package relay

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/request"
)

// recordingSeat records what a watch tells its seat, in order.
type recordingSeat struct {
	mu    sync.Mutex
	calls []string
}

func (s *recordingSeat) Answered() { s.record("answered") }
func (s *recordingSeat) Release()  { s.record("released") }

func (s *recordingSeat) record(c string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

func (s *recordingSeat) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.calls, ", ")
}

// A watch holding its seat for its initial state tells the seat its
// headers are back when they are, not when it gives the seat back: the
// API server's answer time ends at the headers. An answer that is not a
// stream gives the seat back at once.
func TestHeldSeatIsAnsweredAtTheHeaders(t *testing.T) {
	for name, tc := range map[string]struct {
		code int
		want string // what the seat was told by the time the headers were handled
	}{
		"a stream":          {code: http.StatusOK, want: "answered"},
		"an answer of 500":  {code: http.StatusInternalServerError, want: "answered, released"},
		"an answer of 410":  {code: http.StatusGone, want: "answered, released"},
		"switching to a ws": {code: http.StatusSwitchingProtocols, want: "answered, released"},
	} {
		t.Run(name, func(t *testing.T) {
			ws := &Watch{engine: &enginetest.Engine{}, clock: clock.RealClock{}, c: &request.Classification{}, log: logtest.Discard()}
			seat := &recordingSeat{}
			ws.HoldSeatUntilInitialized(seat, time.Hour)
			body, w := io.Pipe()
			t.Cleanup(func() { _ = w.Close() })
			ws.UpstreamAnswered(&http.Response{StatusCode: tc.code, Header: http.Header{"Content-Type": {"application/json"}}, Body: body})
			if got := seat.String(); got != tc.want {
				t.Fatalf("the seat was told %q at the headers, want %q", got, tc.want)
			}
			ws.End()
			if got, want := seat.String(), "answered, released"; got != want {
				t.Fatalf("the seat was told %q by the watch's end, want %q", got, want)
			}
		})
	}
}
