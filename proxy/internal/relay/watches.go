package relay

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// OpenWatches is the set of watches this replica forwards, so that shutdown
// can close them one by one. It is safe for concurrent use.
type OpenWatches struct {
	mu      sync.Mutex
	set     map[*Watch]struct{}
	closing bool
}

// NewOpenWatches returns an empty set that accepts watches.
func NewOpenWatches() *OpenWatches {
	return &OpenWatches{set: map[*Watch]struct{}{}}
}

// Add registers ws; it returns false once closing began (the watch must
// then not be forwarded).
func (o *OpenWatches) Add(ws *Watch) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closing {
		return false
	}
	o.set[ws] = struct{}{}
	return true
}

// Remove forgets ws, once it ended.
func (o *OpenWatches) Remove(ws *Watch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.set, ws)
}

// Len is the number of open watches.
func (o *OpenWatches) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.set)
}

// CloseSpread refuses new watches and closes the open ones evenly over
// grace (the first at once), so that their clients reconnect to the other
// replicas as a trickle rather than a storm. It returns when the last one
// was told to stop.
func (o *OpenWatches) CloseSpread(clk clock.Clock, grace time.Duration) {
	o.mu.Lock()
	o.closing = true
	list := make([]*Watch, 0, len(o.set))
	for ws := range o.set {
		list = append(list, ws)
	}
	o.mu.Unlock()
	if len(list) == 0 {
		return
	}
	interval := grace / time.Duration(len(list))
	for i, ws := range list {
		if i > 0 && interval > 0 {
			clk.Sleep(interval)
		}
		ws.stop()
	}
}
