package proxy

import (
	"container/list"
	"fmt"
	"hash/maphash"
	"net/http"
	"sync"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/watchgate/watchgate/ratelimit"
)

// Warnings tell the client what a budget did to its request, in the
// Warning header kube-apiserver uses for its own (`299 - "text"`, written
// with apimachinery's NewWarningHeader, as ValidatingAdmissionPolicy's Warn
// action does): kubectl prints it on stderr ("Warning: …") and client-go
// logs it. A decision with a Reason carries one: a DryRun budget that would
// have rejected the request, a 429, a local stale-version answer; at most
// one per identity and budget per warningInterval (warningLimiter).
const (
	// warningInterval is the least time between two warnings to one
	// identity about one budget.
	warningInterval = time.Minute
	// maxWarnedIdentities bounds the (identity, budget) pairs remembered.
	maxWarnedIdentities = 16384
)

// warn adds the Warning header that says what budget did to the request
// (decision d on a request of verb v, by user, at now), unless that user
// was warned about that budget within warningInterval. Nothing when the
// decision has no Reason or a is not warning.
func (a *admission) warn(w http.ResponseWriter, now time.Time, user string, v ratelimit.Verb, d *ratelimit.Decision) {
	if a.warnings == nil || d.Reason == ratelimit.ReasonNone || d.Budget == "" || !a.warnings.allow(now, user, d.Budget) {
		return
	}
	if h, err := utilnet.NewWarningHeader(299, "-", warningText(v, d)); err == nil {
		w.Header().Add("Warning", h)
	}
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
		return fmt.Sprintf("watchgate budget %q rejected this %s: %s; retry after %ds", d.Budget, verb, d.Reason.Text(), retryAfterSeconds(d.RetryAfter))
	}
}

// warningLimiter decides whether an identity may be warned about a budget:
// at most once per interval for each (identity, budget) pair, each pair on
// its own, so one identity's warnings never hold back another's.
//
// It remembers at most max pairs, each as a 64-bit hash (seeded at random,
// so callers cannot choose colliding names) and the time it was last
// warned: bounded in count and bytes whatever the names. A pair idle for
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
}

type warned struct {
	key uint64
	at  time.Time
}

func newWarningLimiter(interval time.Duration, max int) *warningLimiter {
	return &warningLimiter{interval: interval, max: max, seed: maphash.MakeSeed(), byKey: make(map[uint64]*list.Element)}
}

// allow reports whether user may be warned about budget at now, and if so
// remembers that it was.
func (l *warningLimiter) allow(now time.Time, user, budget string) bool {
	var h maphash.Hash
	h.SetSeed(l.seed)
	h.WriteString(budget)
	h.WriteByte(0)
	h.WriteString(user)
	key := h.Sum64()

	l.mu.Lock()
	defer l.mu.Unlock()
	l.forgetIdle(now)
	if e, ok := l.byKey[key]; ok {
		p := e.Value.(*warned)
		if now.Sub(p.at) < l.interval {
			return false
		}
		p.at = now
		l.order.MoveToBack(e)
		return true
	}
	for l.order.Len() >= l.max {
		l.remove(l.order.Front())
	}
	l.byKey[key] = l.order.PushBack(&warned{key: key, at: now})
	return true
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
	delete(l.byKey, e.Value.(*warned).key)
	l.order.Remove(e)
}
