package relay

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
	"github.com/watchgate/watchgate/proxy/internal/upstream"
)

// countingAccount is a streamAccount that counts what it is told.
type countingAccount struct {
	buffered, writing, wrote, peak int
}

func (a *countingAccount) AddBuffered(d int) {
	a.buffered += d
	a.peak = max(a.peak, a.buffered)
}
func (a *countingAccount) Writing(n int) { a.writing++; a.AddBuffered(n) }
func (a *countingAccount) Wrote(n int)   { a.wrote++; a.AddBuffered(-n) }

// The bytes an admitted watch's inspector keeps of a frame cut by reads,
// and each write to the client, are told to the account its request
// carries; when the stream ends nothing is left counted.
func TestWatchBodyTellsItsAccount(t *testing.T) {
	account := &countingAccount{}
	ctx := upstream.WithBufferAccount(t.Context(), account)
	ws := &Watch{engine: &enginetest.Engine{}, clock: clock.RealClock{}, c: &request.Classification{}, log: logtest.Discard(),
		clientCtx: ctx, cancel: func() {}}
	frame := `{"type":"ADDED","object":{"kind":"ConfigMap","data":{"blob":"` + strings.Repeat("x", 100<<10) + `"}}}` + "\n"
	reads := [][]byte{[]byte(frame[:40<<10]), []byte(frame[40<<10 : 80<<10]), []byte(frame[80<<10:]), nil}
	b := newWatchBody(ws, io.NopCloser(&streamtest.ChunkedReader{Reads: reads}), streamtest.JSONWatchType, "")
	if b.account == nil {
		t.Fatal("the watch body found no account in its request's context")
	}
	w := httptest.NewRecorder()
	if err := copyWatch(w, b, upstream.CopyBuffers{}, b.account); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	if w.Body.String() != frame {
		t.Fatalf("relayed %d bytes, want the %d-byte frame unchanged", w.Body.Len(), len(frame))
	}
	if account.peak < 40<<10 {
		t.Errorf("at most %d bytes counted, want at least the 40 KiB of the cut frame the inspector keeps", account.peak)
	}
	if account.writing == 0 || account.writing != account.wrote {
		t.Errorf("%d writes started, %d returned; want every write told, start and end", account.writing, account.wrote)
	}
	if account.buffered != 0 {
		t.Errorf("%d bytes still counted after the stream ended", account.buffered)
	}
}
