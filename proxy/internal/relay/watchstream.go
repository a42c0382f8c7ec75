package relay

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/watchgate/watchgate/proxy/internal/inspect"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
	"github.com/watchgate/watchgate/proxy/internal/upstream"
	"github.com/watchgate/watchgate/ratelimit"
)

// Watch follows one admitted watch from its decision to its end and
// reports that end to the engine exactly once (end), however the watch
// ended: the API server closed it, answered an error, died, the client left,
// or the proxy closed it on shutdown. It is the only owner of these fields:
// the forwarder reports what it saw through UpstreamAnswered and
// UpstreamFailed.
//
// The request's goroutine owns it (the reverse proxy calls ModifyResponse
// and ErrorHandler on it, the relay reads the body); stop may be called
// from any goroutine.
type Watch struct {
	engine   watchEngine
	clock    clock.PassiveClock
	log      *sampledlog.Logger
	c        *request.Classification
	decision ratelimit.Decision
	started  time.Time
	// clientCtx is the client's request context; cancel cancels the
	// upstream request's context, derived from it.
	clientCtx context.Context
	cancel    context.CancelFunc
	// verdict, when not nil, is the version this watch asks the
	// API server about for its followers (coalescer); quietWindow is how
	// long after a 200 without an ERROR event the version counts as valid.
	verdict     VersionVerdict
	quietWindow time.Duration
	quiet       *time.Timer
	// stopHandOver stops the hand-over AskFor arranges for when the
	// client leaves; nil: none.
	stopHandOver func() bool
	// coalescer, when not nil, learns how long after its 200 a stale watch's
	// ERROR 410 came (answeredAt), to size the quiet window.
	coalescer  QuietWindows
	answeredAt time.Time

	stopped      atomic.Bool  // the proxy closed the watch (shutdown)
	upstreamCode atomic.Int32 // the API server's status code; 0 before it answered
	transportErr atomic.Bool  // no answer from the API server
	errorEvent   atomic.Bool  // an ERROR event went by
	// initialEventsEnd: the bookmark that ends a watch-list's initial
	// events went by.
	initialEventsEnd atomic.Bool

	body    *watchBody // set when a 200 stream starts
	endOnce sync.Once

	// seat, when not nil, is the seat among the watch opens in flight
	// this watch holds until its initial state has passed
	// (HoldSeatUntilInitialized).
	seat *initSeat
}

// VersionVerdict is the leader of the watches from one resourceVersion
// (coalesce.Leader) that a watch asks the API server for.
type VersionVerdict interface {
	// Settle releases the followers with the verdict the engine has
	// learnt.
	Settle()
	// HandOver releases them without one: one of them asks in its place.
	HandOver()
}

// QuietWindows sizes how long a quiet 200 takes to count as a valid
// version, from how late stale versions' ERROR 410 events came
// (coalesce.Coalescer).
type QuietWindows interface {
	Window(floor time.Duration) time.Duration
	ObserveStale(gap time.Duration)
}

// stop ends the watch cleanly from the client's point of view: the stream
// ends as if the API server had closed it (client-go simply watches again),
// and the watch counts as closed, not failed.
func (ws *Watch) stop() {
	ws.stopped.Store(true)
	ws.cancel()
}

// clientGone reports whether the watch ended because of the client or the
// proxy rather than the API server.
func (ws *Watch) clientGone() bool {
	return ws.stopped.Load() || ws.clientCtx != nil && ws.clientCtx.Err() != nil
}

// UpstreamAnswered is what the forwarder's ModifyResponse does for a
// watch: it records the API server's status code and, for a 200 stream in
// JSON or protobuf, wraps the body to inspect it as it passes.
func (ws *Watch) UpstreamAnswered(resp *http.Response) {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// A watch over WebSocket is relayed, not inspected: it will learn
		// nothing, so its followers go on.
		ws.settleVerdict()
		ws.seatAnswered()
		ws.releaseSeat()
		return
	}
	ws.seatAnswered()
	ws.upstreamCode.Store(int32(resp.StatusCode))
	if resp.StatusCode != http.StatusOK {
		ws.handOverVerdict()
		ws.releaseSeat()
		return
	}
	ws.answeredAt = ws.clock.Now()
	ws.body = newWatchBody(ws, resp.Body, resp.Header.Get("Content-Type"), resp.Header.Get("Content-Encoding"))
	// The reverse proxy sends the headers and an empty body; relay copies
	// the stream after it, without a copy buffer while the watch is idle.
	resp.Body = http.NoBody
	if ws.seat != nil {
		if ws.body.inspect == nil {
			ws.releaseSeat() // its events go by unseen
		} else {
			ws.startSeatTimers()
		}
	}
	if ws.verdict != nil {
		// kube-apiserver sends the ERROR event of a too old version right
		// behind the headers; a quiet stream means the version is valid.
		window := ws.quietWindow
		if ws.coalescer != nil {
			window = ws.coalescer.Window(window)
		}
		ws.quiet = time.AfterFunc(window, ws.verdict.Settle)
	}
}

// Relay copies the stream of a watch the API server answered 200 to the
// client (copyWatch), after the reverse proxy has sent the headers. A
// stream that breaks breaks the client's too (http.ErrAbortHandler), as
// the reverse proxy does, so that the client sees an error, not an end;
// a client that left has nobody to tell (mustAbort).
func (ws *Watch) Relay(w http.ResponseWriter, r *http.Request) {
	var progress writeProgress
	if ws.body.account != nil {
		progress = ws.body.account
	}
	err := copyWatch(w, ws.body, upstream.CopyBuffers{}, progress)
	_ = ws.body.Close()
	if mustAbort(err, r) {
		panic(http.ErrAbortHandler)
	}
}

// mustAbort is whether a relay that ended with err must abort the
// client's stream: when it broke while the client is still there, and an
// http.Server called the handler (which recovers http.ErrAbortHandler).
// A client that left, which is how most watches end, has reset its
// stream or closed its connection already: the panic would only unwind
// the handler and have the HTTP/2 server write a reset nobody reads,
// which cost more CPU than the rest of a watch's end; returning ends the
// handler as well.
func mustAbort(err error, r *http.Request) bool {
	ctx := r.Context()
	return err != nil && ctx.Err() == nil && ctx.Value(http.ServerContextKey) != nil
}

// UpstreamFailed is what the forwarder's ErrorHandler records for a watch
// the API server did not answer; it returns whether the proxy itself closed
// the watch (shutdown).
func (ws *Watch) UpstreamFailed() (stoppedByProxy bool) {
	ws.transportErr.Store(true)
	ws.handOverVerdict()
	return ws.stopped.Load()
}

// End reports the watch's lifetime and outcome to the engine; only the
// first call does anything. The stream has been read by then: the relay
// reads it in the request's goroutine, before end runs.
//
// An upstream 401 or 403 is OutcomeDenied, not a failure: RBAC said no,
// and watching again changes nothing the backoff could help with. An
// upstream 429 is OutcomeThrottled: the API server paces the client
// itself (Retry-After).
func (ws *Watch) End() {
	ws.endOnce.Do(func() {
		if ws.quiet != nil {
			ws.quiet.Stop()
		}
		if ws.stopHandOver != nil {
			ws.stopHandOver()
		}
		ws.releaseSeat()
		ws.handOverVerdict()
		outcome := ratelimit.OutcomeClosed
		if b := ws.body; b != nil {
			_ = b.Close()
			if b.readErr != nil && !ws.clientGone() {
				outcome = ratelimit.OutcomeError
			}
		}
		code := ws.upstreamCode.Load()
		switch {
		case code == http.StatusUnauthorized || code == http.StatusForbidden:
			outcome = ratelimit.OutcomeDenied
		case code == http.StatusTooManyRequests:
			outcome = ratelimit.OutcomeThrottled
		case ws.errorEvent.Load(), code != 0 && code != http.StatusOK:
			outcome = ratelimit.OutcomeError
		case ws.transportErr.Load() && !ws.clientGone():
			outcome = ratelimit.OutcomeError
		}
		now := ws.clock.Now()
		ws.watchListEnded(now, code)
		ws.engine.WatchEnded(now, ws.decision.Watch, now.Sub(ws.started), outcome)
		ended := closedWatches
		switch outcome {
		case ratelimit.OutcomeError:
			ended = failedWatches
		case ratelimit.OutcomeDenied:
			ended = deniedWatches
		case ratelimit.OutcomeThrottled:
			ended = throttledWatches
		}
		ended.Inc()
	})
}

// watchListEnded tells an engine that learns from watch-lists
// (watchListEngine) whether this one, if it is one, sent the bookmark that
// ends its initial events before its stream ended. A watch-list whose
// client or the proxy cut it, that was not answered 200, or whose stream
// was not read (CBOR, WebSocket) says nothing.
func (ws *Watch) watchListEnded(now time.Time, code int32) {
	e, ok := ws.engine.(watchListEngine)
	if !ok || ws.c.SendInitialEvents == nil || !*ws.c.SendInitialEvents ||
		code != http.StatusOK || ws.body == nil || ws.body.inspect == nil || ws.clientGone() {
		return
	}
	e.WatchListEnded(now, ws.decision.Watch, ws.initialEventsEnd.Load())
}

// watchListEngine is an engine that learns whether watch-lists complete
// (a *ratelimit.Engine).
type watchListEngine interface {
	WatchListEnded(now time.Time, w ratelimit.Watch, complete bool)
}

// SawInitialEventsEnd is called when the bookmark that ends a watch-list's
// initial events goes by.
func (ws *Watch) SawInitialEventsEnd() {
	ws.initialEventsEnd.Store(true)
	ws.releaseSeat()
}

// settleVerdict releases the followers waiting on this watch's version, if
// any, with its verdict: they decide again, answered locally if the
// engine has learnt the version stale, upstream otherwise.
func (ws *Watch) settleVerdict() {
	if ws.verdict != nil {
		ws.verdict.Settle()
	}
}

// handOverVerdict releases the followers waiting on this watch's version, if
// any and not settled, without a verdict: one of them asks in its place.
func (ws *Watch) handOverVerdict() {
	if ws.verdict != nil {
		ws.verdict.HandOver()
	}
}

// SawEvent is called for every event in the stream that is not an ERROR:
// the version was valid.
func (ws *Watch) SawEvent() {
	ws.settleVerdict()
	if ws.seat != nil {
		ws.seat.sawEvent()
	}
}

// SawError is called for every ERROR event in the stream with its object.
// A Status with code 410 teaches the engine that the request's
// resourceVersion is stale, before any follower waiting on it decides.
func (ws *Watch) SawError(obj runtime.Object) {
	ws.errorEvent.Store(true)
	status, ok := obj.(*metav1.Status)
	if !ok || status.Code != 410 {
		ws.handOverVerdict()
		return
	}
	rv := ws.c.ResourceVersion
	if rv == "" || rv == "0" {
		return // never too old; the 410 is about something else
	}
	defer ws.settleVerdict() // after the engine has learnt it
	now := ws.clock.Now()
	ws.engine.StaleVersionSeen(now, ws.c.APIGroup, ws.c.Resource, rv)
	staleVersionsLearned.Inc()
	if ws.coalescer != nil && !ws.answeredAt.IsZero() {
		ws.coalescer.ObserveStale(now.Sub(ws.answeredAt))
	}
	ws.log.Info("Learned stale resourceVersion", "group", ws.c.APIGroup, "resource", ws.c.Resource,
		"resourceVersion", sampledlog.Bounded(rv), "message", sampledlog.Bounded(status.Message))
}

// watchBody wraps the API server's watch response body. The bytes pass to
// the client unchanged, chunk by chunk, as the relay (copyWatch) reads them;
// each chunk is also shown to a inspect.Stream (through a inspect.Gzip
// that inflates a copy when the stream is gzip-encoded), in the same
// goroutine, before Read returns. Nothing is held back and nothing runs
// beside the stream: no goroutine, no pipe, no buffer while the watch is
// idle.
type watchBody struct {
	upstream io.ReadCloser
	ws       *Watch
	inspect  *inspect.Stream // nil when the stream is not inspected
	inflate  *inspect.Gzip   // nil unless the stream is gzip-encoded
	readErr  error           // first read error other than io.EOF
	first    [1]byte         // the byte waitByte takes
	closing  sync.Once
	// account, when not nil, is told the bytes the inspectors keep
	// (inspected, as last told) and the relay's writes.
	account   streamAccount
	inspected int
}

// bufferAccountFrom is upstream.BufferAccountFrom, where a parameter
// named upstream hides the package.
var bufferAccountFrom = upstream.BufferAccountFrom

// streamAccount is the guard.Stream the admission filter accounts an
// admitted watch's bytes to, found in the request's context
// (upstream.BufferAccountFrom).
type streamAccount interface {
	upstream.BufferAccount
	writeProgress
}

func newWatchBody(ws *Watch, upstream io.ReadCloser, contentType, contentEncoding string) *watchBody {
	b := &watchBody{ws: ws, upstream: upstream}
	if ws.clientCtx != nil {
		b.account, _ = bufferAccountFrom(ws.clientCtx).(streamAccount)
	}
	if f, s, gzipped, ok := inspect.FramingFor(contentType, contentEncoding); ok {
		b.inspect = inspect.NewStream(f, s, ws)
		if gzipped {
			caller := ""
			if ws.clientCtx != nil {
				caller = request.CallerName(ws.clientCtx)
			}
			b.inflate = inspect.NewGzip(b.inspect, caller)
		}
	}
	return b
}

func (b *watchBody) Read(p []byte) (int, error) {
	n, err := b.upstream.Read(p)
	return b.observe(p[:n], err)
}

// waitByte blocks until the stream has a byte and takes it, uninspected:
// readAfter inspects it with the bytes that follow it.
func (b *watchBody) waitByte() (byte, bool, error) {
	for {
		n, err := b.upstream.Read(b.first[:])
		switch {
		case n == 1 && err == nil:
			return b.first[0], true, nil
		case n == 1:
			_, err = b.observe(b.first[:], err)
			return b.first[0], true, err
		case err != nil:
			_, err = b.observe(nil, err)
			return 0, false, err
		}
	}
}

// readAfter reads into p[1:] the bytes after the one waitByte took, which
// p[0] holds, and inspects p[:n] as one chunk.
func (b *watchBody) readAfter(p []byte) (int, error) {
	n, err := b.upstream.Read(p[1:])
	return b.observe(p[:n+1], err)
}

// observe shows the inspector what a read of the stream returned, and
// keeps its error.
func (b *watchBody) observe(p []byte, err error) (int, error) {
	if len(p) > 0 {
		switch {
		case b.inflate != nil:
			b.inflate.Write(p)
		case b.inspect != nil:
			b.inspect.Write(p)
		}
		b.accountInspected()
	}
	if err != nil && b.inflate != nil {
		if b.ws.clientGone() {
			// Cut by the client or the proxy, perhaps at a moment the
			// client chose: what the gzip inspector holds is not read.
			b.inflate.Release()
		} else {
			b.inflate.Finish()
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		if b.ws.stopped.Load() {
			return len(p), io.EOF // closed by the proxy: end the stream cleanly
		}
		if b.readErr == nil {
			b.readErr = err
		}
	}
	return len(p), err
}

func (b *watchBody) Close() error {
	var err error
	b.closing.Do(func() {
		err = b.upstream.Close()
		if b.inflate != nil {
			b.inflate.Release()
		}
		if b.inspect != nil {
			b.inspect.Release()
		}
		b.accountInspected()
	})
	return err
}

// accountInspected tells the account how the bytes the inspectors keep
// changed since it was last told.
func (b *watchBody) accountInspected() {
	if b.account == nil || b.inspect == nil {
		return
	}
	n := b.inspect.Buffered()
	if b.inflate != nil {
		n += b.inflate.Buffered()
	}
	if d := n - b.inspected; d != 0 {
		b.inspected = n
		b.account.AddBuffered(d)
	}
}

// ForwardedWatch is the forwarder's view of the admitted watch a request
// is, nil for every other request.
func ForwardedWatch(ctx context.Context) upstream.AdmittedWatch {
	if ws := request.AdmittedWatchFrom(ctx); ws != nil {
		return ws
	}
	return nil
}

// watchEngine is what a watch tells the engine (a *ratelimit.Engine).
type watchEngine interface {
	WatchEnded(now time.Time, w ratelimit.Watch, lifetime time.Duration, outcome ratelimit.Outcome)
	StaleVersionSeen(now time.Time, group, resource, resourceVersion string)
}

// NewWatch follows the watch classified c, admitted by d at started,
// whose client's request context is clientCtx; cancel cancels its upstream
// request.
func NewWatch(engine watchEngine, clk clock.PassiveClock, log *sampledlog.Logger, c *request.Classification, d ratelimit.Decision,
	started time.Time, clientCtx context.Context, cancel context.CancelFunc) *Watch {
	return &Watch{engine: engine, clock: clk, log: log, c: c, decision: d, started: started, clientCtx: clientCtx, cancel: cancel}
}

// AskFor makes ws the watch that asks the API server about its version for
// the followers of verdict (nil: none), the quiet window sized by
// coalescer (nil: quietWindow).
// A client that leaves before the verdict hands over at once: its watch
// will learn nothing more, and a follower need not wait for its teardown.
func (ws *Watch) AskFor(verdict VersionVerdict, coalescer QuietWindows, quietWindow time.Duration) {
	ws.verdict, ws.coalescer, ws.quietWindow = verdict, coalescer, quietWindow
	if verdict != nil && ws.clientCtx != nil {
		ws.stopHandOver = context.AfterFunc(ws.clientCtx, ws.handOverVerdict)
	}
}

// Streaming reports whether the API server answered a 200 stream, which
// Relay copies.
func (ws *Watch) Streaming() bool { return ws.body != nil }

// CloseUnrelayed closes the stream without relaying it.
func (ws *Watch) CloseUnrelayed() { _ = ws.body.Close() }

var (
	staleVersionsLearned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "watchgate_proxy_stale_versions_learned_total",
		Help: "ERROR 410 events seen in watch streams from the API server, each teaching the engine a stale resourceVersion.",
	})
	watchesEnded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watchgate_proxy_watches_ended_total",
		Help: "Forwarded watches that ended, by outcome (closed, error, denied: the API server answered 401 or 403, throttled: it answered 429).",
	}, []string{"outcome"})
)

// watchesEnded's children, looked up once rather than at every watch's end.
var (
	closedWatches    = watchesEnded.WithLabelValues("closed")
	failedWatches    = watchesEnded.WithLabelValues("error")
	deniedWatches    = watchesEnded.WithLabelValues("denied")
	throttledWatches = watchesEnded.WithLabelValues("throttled")
)

func init() { metrics.Registry.MustRegister(staleVersionsLearned, watchesEnded) }
