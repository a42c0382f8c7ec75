package admit

import (
	"net/http"

	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/upstream"
)

// serveList forwards a list its budget admitted when the guard admits it
// too (guard.Guard.AdmitList: the caller's lists in flight and buffered
// bytes, the memory mark), accounting the bytes it holds to caller and
// cutting it if its client stops reading (guard.Streams); refused, it is
// answered 429 (503 above the memory mark) with Retry-After at once.
func (a *Admission) serveList(w http.ResponseWriter, r *http.Request, c *request.Classification, caller string, next http.Handler) {
	st, reason, mem := a.Guard.AdmitList(a.Guard.Clock.Now(), caller, guard.WriteCutter(w))
	if reason != "" {
		a.Guard.Refuse(w, r, reason, mem)
		return
	}
	if st == nil {
		forwardCountingRebuilds(w, r, c, next)
		return
	}
	defer st.Close()
	forwardCountingRebuilds(st.Writer(w), r.WithContext(upstream.WithBufferAccount(r.Context(), st)), c, next)
}

// accountWatch accounts the bytes an admitted watch of flow holds to its
// authenticated caller (guard.Streams), when the guard accounts streams:
// it returns the request carrying the account (upstream.WithBufferAccount)
// and the release to call when the watch ends, which gives back its guard
// place.
func (a *Admission) accountWatch(w http.ResponseWriter, r *http.Request, flow guard.Flow) (*http.Request, func()) {
	release := func() { a.Guard.ReleaseFlow(flow) }
	if a.Guard.Streams == nil {
		return r, release
	}
	st := a.Guard.Streams.Open(flow.Caller, false, guard.WriteCutter(w))
	return r.WithContext(upstream.WithBufferAccount(r.Context(), st)), func() {
		st.Close()
		a.Guard.ReleaseFlow(flow)
	}
}
