package proxy

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/watchgate/watchgate/proxy/internal/admit"
	"github.com/watchgate/watchgate/proxy/internal/authn"
	"github.com/watchgate/watchgate/proxy/internal/callertest"
	"github.com/watchgate/watchgate/proxy/internal/coalesce"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/proxy/internal/identity"
	"github.com/watchgate/watchgate/proxy/internal/logtest"
	"github.com/watchgate/watchgate/proxy/internal/relay"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/review"
	"github.com/watchgate/watchgate/proxy/internal/upstream"
	"github.com/watchgate/watchgate/ratelimit"
)

// A filter that panics on its way back from an admitted watch, after the
// admission filter has left the watch's relay to withRelayAtTop, does not
// leak the watch: the upstream stream is closed, the engine hears of the
// watch's end once, and its place in the replica's guard goes back.
func TestRelayAtTopEndsAWatchAFilterPanickedOver(t *testing.T) {
	upstreamDone, stop := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(upstreamDone)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select { // held until the proxy closes it
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(stop) }) // before up.Close, should the test fail
	target, transport, err := upstream.NewTransport(&rest.Config{Host: up.URL}, &upstream.ConnectionCount{}, relay.ForwardedWatch)
	if err != nil {
		t.Fatal(err)
	}
	engine := &enginetest.Engine{}
	logs := logtest.Discard()
	adm := &admit.Admission{
		Engine: engine, Clock: clock.RealClock{}, Watches: relay.NewOpenWatches(), Log: logs, DelaySlots: admit.NewDelaySlots(8),
		Coalescer: coalesce.New(), QuietWindow: coalesce.LeaderQuietWindow, FollowerWait: coalesce.FollowerWait, MaxDelay: 10 * time.Millisecond,
		Guard: guard.New(1, 0, 85, noMemory, clocktesting.NewFakePassiveClock(time.Now())),
	}
	h := admit.WithAdmission(adm, upstream.NewReverseProxy(target, transport, log.New(io.Discard, "", 0), logs, relay.ForwardedWatch))
	h = identity.WithBudgetIdentity(callertest.Impersonation, review.FailClosed, identity.ChargesOf(engine), logs, h)
	h = request.WithClassification(request.NewRequestInfoFactory(), logs, h)
	h = authn.WithAuthentication(callertest.Tokens, review.FailClosed, logs, h)
	panicking := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		panic("a filter failed on the way back")
	})
	top := relay.WithRelayAtTop(panicking)

	req := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=5", nil)
	req.Header.Set("Authorization", "Bearer alice")
	panicked := func() (p any) {
		defer func() { p = recover() }()
		top.ServeHTTP(httptest.NewRecorder(), req)
		return nil
	}()
	if panicked == nil {
		t.Fatal("the filter's panic did not reach the server")
	}
	select {
	case <-upstreamDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream watch is still open")
	}
	if got := engine.WaitEnded(t, 1); len(got) != 1 || got[0] != ratelimit.OutcomeClosed {
		t.Fatalf("engine heard of ends %v, want one closed watch", got)
	}
	if reason, _ := adm.Guard.Admit(time.Now(), "alice"); reason != "" {
		t.Fatalf("the watch's place in the guard was not given back: a new watch is refused %s", reason)
	}
}
