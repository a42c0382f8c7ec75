package ratelimit

// charge is what admitting a watch took from its identity's buckets:
// watch tokens, and a token of a rebuild bucket. A watch the proxy's own
// guard then refused (OutcomeNotForwarded) never reached the API server,
// and gives them back: a client that asks again after the guard's
// Retry-After is not refused by its budget for opens that never happened.
type charge struct {
	tokens  int32
	rebuild rebuildCharge
}

// rebuildCharge says which rebuild bucket a watch took its token from; 0:
// none.
type rebuildCharge uint8

const (
	// chargedResource: the bucket of the watch's resource.
	chargedResource rebuildCharge = iota + 1
	// chargedOverflow: the identity's overflow bucket.
	chargedOverflow
)

// giveBack returns the tokens s's watch took from id's buckets. A
// resource's bucket whose slot went to another resource meanwhile (it was
// full again) gets nothing back. id.sh.mu is held.
func (e *Engine) giveBack(id *identity, s *slot) {
	c := s.charged
	s.charged = charge{}
	if c.tokens > 0 && id.watch.limited() {
		id.watch.giveBack(float64(c.tokens))
	}
	rl := id.resLists
	if rl == nil {
		return
	}
	switch c.rebuild {
	case chargedOverflow:
		rl.overflow.giveBack(1)
	case chargedResource:
		res := e.resourceHash(s.req.group, s.req.resource)
		for i := range rl.slots {
			if rl.slots[i].resource == res {
				rl.slots[i].b.giveBack(1)
				return
			}
		}
	}
}
