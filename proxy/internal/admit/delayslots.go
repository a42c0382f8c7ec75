package admit

import (
	"sync"

	"github.com/watchgate/watchgate/proxy/internal/guard"
)

// DelaySlots are the places for rejections held before they are answered
// (Admission.delay): at most n in all, and a quarter of them (at least
// one) per tenant (guard.TenantOf: a namespace's service accounts
// together), so that one tenant's storm, whose answers are held longest,
// cannot take the places another tenant's rejections need. A rejection
// that finds no place is answered at once. State is one entry per tenant
// holding places, freed with its last one.
type DelaySlots struct {
	mu        sync.Mutex
	total     int
	perTenant int
	n         int            // places held; guarded by mu
	held      map[string]int // per tenant; guarded by mu
}

// NewDelaySlots returns n places, a quarter of them per tenant.
func NewDelaySlots(n int) *DelaySlots {
	return &DelaySlots{total: n, perTenant: max(1, n/4), held: map[string]int{}}
}

// take takes a place for a rejection of caller, or reports there is none.
func (s *DelaySlots) take(caller string) bool {
	tenant := guard.TenantOf(caller)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n >= s.total || s.held[tenant] >= s.perTenant {
		return false
	}
	s.n++
	s.held[tenant]++
	return true
}

// give gives back a place take took for caller.
func (s *DelaySlots) give(caller string) {
	tenant := guard.TenantOf(caller)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[tenant] == 0 {
		return
	}
	s.n--
	if s.held[tenant]--; s.held[tenant] == 0 {
		delete(s.held, tenant)
	}
}
