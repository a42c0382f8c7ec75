package enginetest

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/watchgate/watchgate/ratelimit"
)

// Engine decides with DecideFunc (allow everything when nil) and records
// what the proxy told it.
type Engine struct {
	DecideFunc func(*ratelimit.Request) ratelimit.Decision

	mu       sync.Mutex
	requests []ratelimit.Request
	ended    []ratelimit.Outcome
	stale    []string // "group/resource@rv"
}

// Decide records r and returns DecideFunc's decision, or allows r when
// DecideFunc is nil.
func (e *Engine) Decide(_ time.Time, r *ratelimit.Request) ratelimit.Decision {
	e.mu.Lock()
	e.requests = append(e.requests, *r)
	e.mu.Unlock()
	if e.DecideFunc == nil {
		return ratelimit.Decision{Allowed: true}
	}
	return e.DecideFunc(r)
}

// WatchEnded records the watch's outcome.
func (e *Engine) WatchEnded(_ time.Time, _ ratelimit.Watch, _ time.Duration, o ratelimit.Outcome) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ended = append(e.ended, o)
}

// StaleVersionSeen records the version as "group/resource@rv".
func (e *Engine) StaleVersionSeen(_ time.Time, group, resource, rv string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stale = append(e.stale, group+"/"+resource+"@"+rv)
}

// Sweep forgets nothing: the Engine keeps no state to expire.
func (e *Engine) Sweep(time.Time) int { return 0 }

// Snapshot returns copies of what the proxy told the Engine so far: the
// requests decided, the outcomes of the watches ended and the stale
// versions seen, each in the order they came.
func (e *Engine) Snapshot() (requests []ratelimit.Request, ended []ratelimit.Outcome, stale []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.requests), slices.Clone(e.ended), slices.Clone(e.stale)
}

// WaitEnded waits (at most 5s) until n watches ended and returns their outcomes.
func (e *Engine) WaitEnded(t *testing.T, n int) []ratelimit.Outcome {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, ended, _ := e.Snapshot()
		if len(ended) >= n || time.Now().After(deadline) {
			return ended
		}
		time.Sleep(10 * time.Millisecond)
	}
}
