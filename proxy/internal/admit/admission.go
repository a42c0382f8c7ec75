package admit

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/coalesce"
	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/proxy/internal/relay"
	"github.com/watchgate/watchgate/proxy/internal/request"
	"github.com/watchgate/watchgate/proxy/internal/sampledlog"
	"github.com/watchgate/watchgate/ratelimit"
)

// Admission asks the engine about every watch and list and answers the
// rejected ones itself.
type Admission struct {
	Engine  Engine
	Clock   clock.Clock
	Watches *relay.OpenWatches
	Log     *sampledlog.Logger
	// maxDelay caps the wait before a rejection is answered, and
	// MaxStaleDelay, when longer, that of a stale watch's answer (see
	// reject); DelaySlots caps how many rejections wait at once, per
	// tenant first.
	MaxDelay      time.Duration
	MaxStaleDelay time.Duration
	DelaySlots    *DelaySlots
	// coalescer holds back followers, concurrent watches from one
	// resourceVersion, while their leader asks the API server (nil: none
	// are held); quietWindow and followerWait are its timings.
	Coalescer    *coalesce.Coalescer
	QuietWindow  time.Duration
	FollowerWait time.Duration
	// guard, when not nil, shares the replica's watches among the callers
	// (see guard.Guard); it decides after the budget.
	Guard *guard.Guard
	// seats, when not nil, bounds the watch opens in flight upstream and
	// queues the others fairly (see watchOpenSeats); a watch waits for its
	// seat after its budget admitted it and before the guard, so that a
	// waiting watch holds no place on the replica.
	Seats *watchOpenSeats
	// InitSeatGap is how long the stream of a watch that asks for initial
	// state must be quiet for that state to count as passed and its seat
	// to go back (0: relay.InitSeatGap).
	InitSeatGap time.Duration
	// opens, when not nil, caps how fast each caller opens watches that
	// go upstream (see watchOpenRate); it decides after the guard.
	Opens *watchOpenRate
	// warnings, when not nil, limits the Warning headers that tell clients
	// what a budget did (see warn).
	Warnings *warningLimiter
}

// Engine is what admission asks and tells the engine (a
// *ratelimit.Engine).
type Engine interface {
	Decide(now time.Time, r *ratelimit.Request) ratelimit.Decision
	WatchEnded(now time.Time, w ratelimit.Watch, lifetime time.Duration, outcome ratelimit.Outcome)
	StaleVersionSeen(now time.Time, group, resource, resourceVersion string)
}

// WithAdmission decides every budgeted request (see classify) with the
// engine; everything else passes untouched. A rejected watch or list is
// answered after a short delay (the engine's retry-after, at most maxDelay,
// cut short when the client leaves): a stale watch with a 200 ERROR/410
// stream, anything else with 429 and Retry-After. An admitted watch then
// asks the watch guard for a place on the replica, and is followed to its
// end (relay.Watch). So a watch holds a guard place only once its budget
// admitted it: never while it follows a leader, nor through a rejection's
// delay. Before the guard, an admitted watch waits its turn for a seat
// among the watch opens in flight upstream (watchOpenSeats), holding
// nothing shared while it waits; the seat goes back once the response's
// headers are written. Last, a watch about to go upstream takes one of its
// caller's watch opens (watchOpenRate, off by default); refused, it gives
// its place back and is answered 429 at once.
func WithAdmission(a *Admission, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := request.ClassificationFrom(r.Context())
		id, idOK := request.IdentityFrom(r.Context())
		if !ok || !idOK || c.Verb == 0 {
			otherRequests.Inc()
			next.ServeHTTP(w, r)
			return
		}
		caller := request.CallerName(r.Context())
		var lead *coalesce.Leader
		if k, ok := coalesce.KeyOf(c); ok && a.Coalescer != nil {
			if lead, ok = a.Coalescer.Coalesce(r.Context(), k, caller, a.FollowerWait); !ok {
				return // the client left
			}
		}
		// An admitted watch ends after its relay (serveWatch), which may
		// run after this filter has returned: serveWatch hands its leader
		// over then; every other path here, on return.
		watchServed := false
		defer func() {
			if lead != nil && !watchServed {
				lead.HandOver()
			}
		}()
		start := a.Clock.Now()
		d := a.decide(w, r, c, id, start)
		switch {
		case !d.Allowed:
			if lead != nil {
				// Its followers need not wait out the rejection's delay: the
				// engine knows the version stale, or they ask themselves.
				if d.Reason == ratelimit.ReasonStaleResourceVersion {
					lead.Settle()
				} else {
					lead.HandOver()
				}
			}
			a.reject(w, r, c, &d)
		case c.Verb == ratelimit.VerbWatch:
			flow := flowOf(r, caller, id)
			seat := func() {}
			var st *openSeat
			if a.Seats != nil {
				var ok bool
				st, ok = a.Seats.acquire(r.Context(), flow)
				if !ok {
					a.notForwarded(&d, lead)
					if r.Context().Err() == nil {
						a.warnGuard(w, a.Clock.Now(), caller, GuardWatchOpenQueue, nil, seatRetryAfterSeconds)
						a.Seats.Refuse(w, r)
					}
					return
				}
				seat = st.Release
				defer func() {
					if !watchServed {
						st.Release()
					}
				}()
			}
			if a.Guard != nil {
				reason, mem := a.Guard.AdmitFlow(a.Guard.Clock.Now(), flow)
				if reason != "" {
					seat()
					a.notForwarded(&d, lead)
					a.warnGuard(w, a.Clock.Now(), caller, reason, mem, guard.RetryAfterSeconds)
					a.Guard.Refuse(w, r, reason, mem)
					return
				}
			}
			if a.Opens != nil {
				if wait, ok := a.Opens.allow(a.Clock.Now(), caller, flow.User); !ok {
					seat()
					if a.Guard != nil {
						a.Guard.ReleaseFlow(flow)
					}
					a.notForwarded(&d, lead)
					a.warnGuard(w, a.Clock.Now(), caller, GuardWatchOpenRate, nil, answer.RetryAfterSeconds(wait))
					a.Opens.Refuse(w, r, wait)
					return
				}
			}
			var release func()
			if a.Guard != nil {
				r, release = a.accountWatch(w, r, flow)
				a.warnGuardOwed(w, caller)
			}
			watchServed = true
			a.serveWatch(w, r, c, &d, start, lead, release, st, next)
		case c.Verb == ratelimit.VerbList && a.Guard != nil:
			a.serveList(w, r, c, caller, next)
		default:
			forwardCountingRebuilds(w, r, c, next)
		}
	})
}

// flowOf is the guard's flow of a watch caller opens as id: under the
// caller, as the user it impersonates when it does.
func flowOf(r *http.Request, caller string, id user.Info) guard.Flow {
	if request.ImpersonatedFrom(r.Context()) {
		return guard.FlowOf(caller, id.GetName())
	}
	return guard.FlowOf(caller, "")
}

// notForwarded ends a watch its budget admitted (d) and that is refused
// after all: its slot goes back, and its followers need not wait.
func (a *Admission) notForwarded(d *ratelimit.Decision, lead *coalesce.Leader) {
	a.Engine.WatchEnded(a.Clock.Now(), d.Watch, 0, ratelimit.OutcomeNotForwarded)
	if lead != nil {
		lead.HandOver()
	}
}

// decide asks the engine about the request classified c on behalf of id,
// counts and names the decision (metrics, X-Watchgate-Decision, a sampled
// log line and a rate-limited Warning header for anything but a plain
// allow) and returns it.
//
// It is a function of its own, kept out of line, so that the request and
// the log line's arguments take stack space only while it runs: a watch's
// handler goroutine keeps the frames below the reverse proxy for as long
// as the watch is open, and every byte of them that pushes the goroutine
// over its starting stack costs a stack copy per watch (make bench's
// profiles showed runtime.newstack under the engine's decide as ~4% of
// watchgate's CPU in a run of watch opens).
//
//go:noinline
func (a *Admission) decide(w http.ResponseWriter, r *http.Request, c *request.Classification, id user.Info, start time.Time) ratelimit.Decision {
	req := ratelimit.Request{
		User:                 id.GetName(),
		Groups:               id.GetGroups(),
		Verb:                 c.Verb,
		Group:                c.APIGroup,
		Resource:             c.Resource,
		Namespace:            c.Namespace,
		LabelSelector:        c.LabelSelector,
		FieldSelector:        c.FieldSelector,
		ResourceVersion:      c.ResourceVersion,
		ResourceVersionMatch: c.ResourceVersionMatch,
		SendInitialEvents:    c.SendInitialEvents,
		QueryRefused:         c.QueryRefused,
		Continuation:         c.Continue,
		Impersonated:         request.ImpersonatedFrom(r.Context()),
	}
	if req.Impersonated {
		if caller, ok := request.CallerFrom(r.Context()); ok {
			req.Caller, req.CallerGroups = caller.GetName(), caller.GetGroups()
		}
	}
	d := a.Engine.Decide(start, &req)
	verb := verbLabel(c.Verb)
	decisionSecondsOf(c.Verb).Observe(a.Clock.Since(start).Seconds())
	decision := decisionLabel(d)
	requestsTotal.WithLabelValues(verb, decision, string(d.Reason), d.Budget, string(d.Enforcement)).Inc()
	if d.Budget != "" {
		w.Header()[answer.DecisionHeader] = []string{decisionHeader(d)} // canonical already
	}
	a.warn(w, start, id.GetName(), c.Verb, &d)
	if d.Reason != ratelimit.ReasonNone {
		a.Log.Info("Decision", "decision", decision, "reason", d.Reason, "budget", d.Budget, "user", id.GetName(),
			"verb", verb, "group", c.APIGroup, "resource", c.Resource, "namespace", c.Namespace,
			"resourceVersion", c.ResourceVersion, "retryAfter", d.RetryAfter)
	}
	return d
}

// reject answers a rejected watch or list after a short delay (see
// WithAdmission): the engine's retry-after, at most MaxDelay. A stale
// watch's answer is held up to MaxStaleDelay instead: its hold grows with
// the budget's backoff while a client comes back with the version at once
// (ratelimit's stale hold), and a watch that waits before its first event
// is what any client expects of a watch, so that a looping client is
// answered at the pace of its backoff, not once per MaxDelay. Out of line
// for the reason decide is.
//
//go:noinline
func (a *Admission) reject(w http.ResponseWriter, r *http.Request, c *request.Classification, d *ratelimit.Decision) {
	staleWatch := d.Reason == ratelimit.ReasonStaleResourceVersion && c.Verb == ratelimit.VerbWatch
	limit := a.MaxDelay
	if staleWatch {
		limit = max(limit, a.MaxStaleDelay)
	}
	if !a.delay(r.Context(), request.CallerName(r.Context()), d.RetryAfter, limit) {
		return // the client left
	}
	if staleWatch {
		answer.WriteTooOld(w, r, c.ResourceVersion)
		return
	}
	if d.Reason == ratelimit.ReasonWatchListIncomplete {
		answer.WriteStatus(w, r, watchListRefused(*d))
		return
	}
	answer.WriteStatus(w, r, tooManyRequests(*d))
}

// Children of the request metrics that every request would otherwise look
// up by label values (a lock and a hash per lookup): the unbudgeted
// requests' counter and the decision-time histograms per verb.
var (
	otherRequests         = requestsTotal.WithLabelValues("other", "allow", "", "", "")
	watchDecisionSeconds  = decisionSeconds.WithLabelValues("watch")
	listDecisionSeconds   = decisionSeconds.WithLabelValues("list")
	otherDecisionsSeconds = decisionSeconds.WithLabelValues("other")
)

func decisionSecondsOf(v ratelimit.Verb) prometheus.Observer {
	switch v {
	case ratelimit.VerbWatch:
		return watchDecisionSeconds
	case ratelimit.VerbList:
		return listDecisionSeconds
	default:
		return otherDecisionsSeconds
	}
}

// serveWatch forwards an admitted watch, relays its stream and ends it:
// the engine hears of its end, its place in the watch guard goes back
// (release, when not nil) and its followers, when it leads (lead), are
// handed over, also when the proxy panics out of the stream
// (http.ErrAbortHandler). Its seat among the watch opens in flight (held,
// nil: none) goes back as soon as the response's headers are written, or,
// for a watch that asks for initial state, once that state has passed
// (relay's HoldSeatUntilInitialized). Under
// relay.WithRelayAtTop the relay and the end run there, after the filters
// have returned; otherwise here.
func (a *Admission) serveWatch(w http.ResponseWriter, r *http.Request, c *request.Classification, d *ratelimit.Decision, start time.Time, lead *coalesce.Leader, release func(), held *openSeat, next http.Handler) {
	st, r := request.StateOf(r)
	ctx, cancel := context.WithCancel(r.Context())
	ws := relay.NewWatch(a.Engine, a.Clock, a.Log, c, *d, start, r.Context(), cancel)
	seat := func() {}
	if held != nil {
		if c.AsksInitialState() {
			ws.HoldSeatUntilInitialized(held, a.InitSeatGap)
		} else {
			seat = held.releaseAnswered
			defer held.Release() // when it was not forwarded
		}
	}
	var verdict relay.VersionVerdict
	if lead != nil {
		verdict = lead
	}
	var windows relay.QuietWindows
	if a.Coalescer != nil {
		windows = a.Coalescer
	}
	ws.AskFor(verdict, windows, a.QuietWindow)
	added := false
	end := func() {
		if added {
			activeWatches.Dec()
			a.Watches.Remove(ws)
		}
		ws.End()
		cancel()
		if release != nil {
			release()
		}
		if lead != nil {
			lead.HandOver()
		}
	}
	relayed := false
	defer func() {
		if !relayed {
			end()
		}
	}()
	if !a.Watches.Add(ws) {
		answer.WriteStatus(w, r, answer.ServiceUnavailable(answer.ShuttingDownMessage, 1))
		return
	}
	added = true
	activeWatches.Inc()
	upstreamWatchOpens.Inc()
	st.Watch = ws
	next.ServeHTTP(relay.NewWatchHeaders(seatWriter{ResponseWriter: w, answered: seat}), r.WithContext(ctx))
	seat()
	if !ws.Streaming() {
		return
	}
	countWatchRebuild(c)
	if st.RelayAtTop {
		relayed = true
		st.Relay = func(stream bool) {
			defer end()
			if !stream {
				ws.CloseUnrelayed()
				return
			}
			ws.Relay(w, r)
		}
		return
	}
	ws.Relay(w, r)
}

// delay waits min(retryAfter, limit) for a rejection of caller unless
// there is no place to wait in (DelaySlots: too many rejections waiting,
// or too many of caller's tenant); it returns false when the client left
// meanwhile.
func (a *Admission) delay(ctx context.Context, caller string, retryAfter, limit time.Duration) bool {
	d := min(retryAfter, limit)
	if d <= 0 {
		return ctx.Err() == nil
	}
	if !a.DelaySlots.take(caller) {
		return ctx.Err() == nil
	}
	defer a.DelaySlots.give(caller)
	t := a.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

// tooManyRequests is the 429 Status of a rejection, with
// details.retryAfterSeconds (at least 1).
func tooManyRequests(d ratelimit.Decision) *apierrors.StatusError {
	secs := answer.RetryAfterSeconds(d.RetryAfter)
	return apierrors.NewTooManyRequests(fmt.Sprintf("%s (watchgate budget %q), please try again in %ds", d.Reason.Text(), d.Budget, secs), secs)
}

func verbLabel(v ratelimit.Verb) string {
	switch v {
	case ratelimit.VerbWatch:
		return "watch"
	case ratelimit.VerbList:
		return "list"
	default:
		return "other"
	}
}

func decisionLabel(d ratelimit.Decision) string {
	switch {
	case !d.Allowed:
		return "reject"
	case d.DryRun || d.Reason != ratelimit.ReasonNone:
		return "dryrun-reject"
	default:
		return "allow"
	}
}

// decisionHeader is DecisionHeader's value for the engine's decision d.
func decisionHeader(d ratelimit.Decision) string {
	retryAfter := 0
	if !d.Allowed && d.Reason != ratelimit.ReasonStaleResourceVersion {
		retryAfter = answer.RetryAfterSeconds(d.RetryAfter)
	}
	return answer.FormatDecision(decisionLabel(d), string(d.Reason), d.Budget, retryAfter)
}
