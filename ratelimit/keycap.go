package ratelimit

import "sync/atomic"

// keyCap counts the keys of one kind the engine tracks (identities, backoff
// keys, stale versions, stale resources) against a cap. It is the one place
// where tracked state is counted; it is safe for simultaneous use by
// multiple goroutines.
type keyCap struct {
	n   atomic.Int64
	max int64
}

// take counts one more key and reports whether it fits under the cap; when
// it does not, nothing is counted.
func (c *keyCap) take() bool {
	if c.n.Add(1) > c.max {
		c.n.Add(-1)
		return false
	}
	return true
}

// give uncounts n keys.
func (c *keyCap) give(n int) { c.n.Add(-int64(n)) }

// count is the number of keys counted.
func (c *keyCap) count() int64 { return c.n.Load() }
