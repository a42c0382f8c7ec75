package admit

import (
	"container/list"
	"fmt"
	"hash/maphash"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/guard"
	"github.com/watchgate/watchgate/ratelimit"
)

// Warnings tell the client what a budget did to its request, in the
// Warning header kube-apiserver uses for its own (`299 - "text"`, written
// with apimachinery's NewWarningHeader, as ValidatingAdmissionPolicy's Warn
// action does): kubectl prints it on stderr ("Warning: …") and client-go
// logs it. A decision with a Reason carries one: a DryRun budget that would
// have rejected the request, a 429, a local stale-version answer; at most
// one per identity and budget per warningInterval (warningLimiter).
//
// A watch the replica's own guard refused (watchguard.go) carries one too,
// naming the guard's reason and the flag that set the limit: at most one
// per caller per warningInterval, whatever the reason.
//
// client-go retries a 429 or 503 that has a Retry-After by itself and shows
// nothing of it, its warnings included: so the next admitted request of
// the identity under the same budget repeats the rejection's warning
// ("… rejected an earlier list …"), and the caller's next watch the guard
// admits repeats the guard's ("… refused an earlier watch …"), once.
const (
	// warningInterval is the least time between two warnings to one
	// identity about one budget.
	WarningInterval = time.Minute
	// maxWarnedIdentities bounds the (identity, budget) pairs remembered.
	MaxWarnedIdentities = 16384
	// guardWarnings is the budget under which guard refusals are
	// remembered: no WatchBudget has this name ('/' is not allowed in one).
	guardWarnings = "/guard"
)

// warn adds the Warning header that says what budget did to the request
// (decision d on a request of verb v, by user, at now), unless that user
// was warned about that budget within warningInterval; or, for an admitted
// request without a Reason, the one owed for an earlier 429. Nothing when
// a is not warning.
func (a *Admission) warn(w http.ResponseWriter, now time.Time, user string, v ratelimit.Verb, d *ratelimit.Decision) {
	if a.Warnings == nil || d.Budget == "" {
		return
	}
	var text string
	switch {
	case d.Reason == ratelimit.ReasonNone:
		r, ok := a.Warnings.owed(user, d.Budget)
		if !ok {
			return
		}
		text = fmt.Sprintf("watchgate budget %q rejected an earlier %s: %s; retried after %ds", d.Budget, verbLabel(r.verb), r.reason.Text(), r.retryAfterSeconds)
	case a.Warnings.allow(now, user, d.Budget, retriedRejection(v, d)):
		text = warningText(v, d)
	default:
		return
	}
	if h, err := utilnet.NewWarningHeader(299, "-", text); err == nil {
		w.Header().Add("Warning", h)
	}
}

// retriedRejection is the rejection d of a request of verb v, when it is a
// 429 a client may retry without showing it; nil otherwise.
func retriedRejection(v ratelimit.Verb, d *ratelimit.Decision) *rejection {
	if d.Allowed || (d.Reason == ratelimit.ReasonStaleResourceVersion && v == ratelimit.VerbWatch) {
		return nil
	}
	return &rejection{verb: v, reason: d.Reason, retryAfterSeconds: answer.RetryAfterSeconds(d.RetryAfter)}
}

// warningText says, in one sentence, what the budget did to a request of
// verb v: a DryRun budget would have rejected it, an Enforce budget
// rejected it (and when to retry) or answered a watch's stale version
// itself. The budget name is printed with %q, so it holds no control
// characters.
func warningText(v ratelimit.Verb, d *ratelimit.Decision) string {
	verb := verbLabel(v)
	switch {
	case d.Allowed:
		return fmt.Sprintf("watchgate budget %q (DryRun) would have rejected this %s: %s", d.Budget, verb, d.Reason.Text())
	case d.Reason == ratelimit.ReasonStaleResourceVersion && v == ratelimit.VerbWatch:
		return fmt.Sprintf("watchgate budget %q answered this watch with 410 Expired: %s; list again, then watch from the list's resourceVersion", d.Budget, d.Reason.Text())
	default:
		return fmt.Sprintf("watchgate budget %q rejected this %s: %s; retry after %ds", d.Budget, verb, d.Reason.Text(), answer.RetryAfterSeconds(d.RetryAfter))
	}
}

// warnGuard adds the Warning header that says why the watch guard refused
// a watch of caller at now (reason, with the memory sample s it decided
// on), unless that caller was warned about a guard refusal within
// warningInterval.
func (a *Admission) warnGuard(w http.ResponseWriter, now time.Time, caller, reason string, s *guard.MemorySample, retryAfter int) {
	if a.Warnings == nil || !a.Warnings.allow(now, caller, guardWarnings, &rejection{verb: ratelimit.VerbWatch, guard: reason, retryAfterSeconds: retryAfter}) {
		return
	}
	text := fmt.Sprintf("watchgate refused this watch on this replica (%s: %s); retry after %ds", reason, a.refusalText(reason, s), retryAfter)
	if h, err := utilnet.NewWarningHeader(299, "-", text); err == nil {
		w.Header().Add("Warning", h)
	}
}

// warnGuardOwed adds, to a watch of caller the guard admitted, the Warning
// header owed for the guard's last refusal of that caller, if any.
func (a *Admission) warnGuardOwed(w http.ResponseWriter, caller string) {
	if a.Warnings == nil {
		return
	}
	r, ok := a.Warnings.owed(caller, guardWarnings)
	if !ok {
		return
	}
	text := fmt.Sprintf("watchgate refused an earlier watch on this replica (%s: %s); retried after %ds", r.guard, a.refusalText(r.guard, nil), r.retryAfterSeconds)
	if h, err := utilnet.NewWarningHeader(299, "-", text); err == nil {
		w.Header().Add("Warning", h)
	}
}

// refusalText says which limit of the replica refused a watch for reason:
// the watch-open ceiling's, the watch opens in flight's, or the guard's.
func (a *Admission) refusalText(reason string, s *guard.MemorySample) string {
	switch {
	case reason == GuardWatchOpenRate && a.Opens != nil:
		return a.Opens.text()
	case reason == GuardWatchOpenQueue && a.Seats != nil:
		return a.Seats.text()
	case a.Guard == nil:
		return reason
	}
	return a.Guard.RefusalText(reason, s)
}

// rejection is what a repeated warning says about a 429 (or a guard's 503).
type rejection struct {
	verb   ratelimit.Verb
	reason ratelimit.Reason // one of the engine's constants, not a copy
	// guard, for a refusal of the watch guard, is its reason (one of the
	// Guard constants), and reason is empty.
	guard             string
	retryAfterSeconds int
}

// warningLimiter decides whether an identity may be warned about a budget:
// at most once per interval for each (identity, budget) pair, each pair on
// its own, so one identity's warnings never hold back another's.
//
// It remembers at most max pairs, each as a 64-bit hash (seeded at random,
// so callers cannot choose colliding names), the time it was last warned
// and the rejection it owes a repeat of: bounded in count and bytes
// whatever the names. A pair idle for
// interval is forgotten (as good as never warned); when max pairs were all
// warned within interval, the least recently warned is forgotten, so under
// that load a pair may be warned more often, never less.
//
// Time is a parameter. It is safe for simultaneous use by multiple
// goroutines.
type warningLimiter struct {
	interval time.Duration
	max      int
	seed     maphash.Seed

	mu sync.Mutex
	// byKey indexes order, whose elements are *warned, least recently
	// warned first.
	byKey map[uint64]*list.Element
	order list.List
	// owing is the number of pairs whose owed is set, read without mu.
	owing atomic.Int64
}

type warned struct {
	key uint64
	at  time.Time
	// owed, when not nil, is the 429 the pair was last warned about, to
	// repeat on its next admitted request (see owed).
	owed *rejection
}

// NewWarningLimiter returns a limiter that warns each (identity, budget)
// pair at most once per interval and remembers at most max pairs.
func NewWarningLimiter(interval time.Duration, max int) *warningLimiter {
	return &warningLimiter{interval: interval, max: max, seed: maphash.MakeSeed(), byKey: make(map[uint64]*list.Element)}
}

// allow reports whether user may be warned about budget at now, and if so
// remembers that it was, and that it owes a repeat of the warning about
// retried (nil: none) on the pair's next admitted request.
func (l *warningLimiter) allow(now time.Time, user, budget string, retried *rejection) bool {
	key := l.key(user, budget)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forgetIdle(now)
	if e, ok := l.byKey[key]; ok {
		p := e.Value.(*warned)
		if now.Sub(p.at) < l.interval {
			return false
		}
		p.at, p.owed = now, retried
		l.order.MoveToBack(e)
		l.countOwed(p, retried)
		return true
	}
	for l.order.Len() >= l.max {
		l.remove(l.order.Front())
	}
	p := &warned{key: key, at: now}
	l.countOwed(p, retried)
	p.owed = retried
	l.byKey[key] = l.order.PushBack(p)
	return true
}

// owed returns, and forgets, the rejection user is owed a repeated warning
// about under budget, if any. It takes no lock while nothing is owed.
func (l *warningLimiter) owed(user, budget string) (rejection, bool) {
	if l.owing.Load() == 0 {
		return rejection{}, false
	}
	key := l.key(user, budget)
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.byKey[key]
	if !ok || e.Value.(*warned).owed == nil {
		return rejection{}, false
	}
	p := e.Value.(*warned)
	r := *p.owed
	l.countOwed(p, nil)
	p.owed = nil
	return r, true
}

func (l *warningLimiter) key(user, budget string) uint64 {
	var h maphash.Hash
	h.SetSeed(l.seed)
	h.WriteString(budget)
	h.WriteByte(0)
	h.WriteString(user)
	return h.Sum64()
}

// countOwed keeps owing the number of pairs that owe a repeat, as p.owed
// is about to become next. l.mu must be held.
func (l *warningLimiter) countOwed(p *warned, next *rejection) {
	switch {
	case p.owed == nil && next != nil:
		l.owing.Add(1)
	case p.owed != nil && next == nil:
		l.owing.Add(-1)
	}
}

// len is the number of pairs remembered.
func (l *warningLimiter) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len()
}

// forgetIdle forgets the pairs last warned interval or more before now.
// l.mu must be held.
func (l *warningLimiter) forgetIdle(now time.Time) {
	for e := l.order.Front(); e != nil && now.Sub(e.Value.(*warned).at) >= l.interval; e = l.order.Front() {
		l.remove(e)
	}
}

// remove forgets e. l.mu must be held.
func (l *warningLimiter) remove(e *list.Element) {
	p := e.Value.(*warned)
	l.countOwed(p, nil)
	delete(l.byKey, p.key)
	l.order.Remove(e)
}
