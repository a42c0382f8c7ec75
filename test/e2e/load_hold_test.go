//go:build load

package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/watchgate/watchgate/test/apiserver"
)

// heldReplica is what the held replica did.
type heldReplica struct {
	limit, goMemLimit  int64
	asked, maxWatches  int
	hold               time.Duration
	open               opening // the first opening, up to asked
	reopened           int
	churnRefused       map[string]int
	base, rest, held   sample // before, opened and at rest, at the end
	restWatches        int
	watches            int
	peakRSS            uint64
	ended              int
	heapTop, goroutine string // profiles at profiled watches, if taken
	profiled           int
	profileErr         error
}

// profileAt is the count of watches the held replica is profiled at.
const profileAt = 10000

// holdReplica runs a replica as the chart does with a 1 GiB limit
// (GOMEMLIMIT 90% of it) and --max-watches n plus 1% (a watch's place is
// released once its upstream stream ended, after its client saw it
// close: one second's reopening may come first), opens n watches at once (in
// two steps when profileDir is set: profileAt, the profiles, the rest),
// then holds them for hold while 1% of them close and reopen each second.
func holdReplica(t *testing.T, e *apiserver.Env, bin, client string, shape clientShape, n int, hold time.Duration, profileDir string) heldReplica {
	t.Helper()
	h := heldReplica{limit: 1 << 30, asked: n, maxWatches: n + max(1, n/100), hold: hold, churnRefused: map[string]int{}}
	h.goMemLimit = h.limit * 9 / 10
	p := startWatchgate(t, e, bin, []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", h.goMemLimit>>20)},
		fmt.Sprintf("--max-watches=%d", h.maxWatches), fmt.Sprintf("--max-watches-per-identity=%d", h.maxWatches), "--watch-opens-per-identity-per-second=0",
		"--zap-log-level=1") // its sampled request errors, such as "Cannot reach the API server"
	defer p.stop()
	peak := p.peakRSS(time.Second)
	f := startFleet(t, client, p.url, n, shape)
	defer f.stop()
	h.base = p.sampleAfter(true)
	first := n
	if profileDir != "" && n > profileAt {
		first = profileAt
	}
	h.open = f.open(t, first)
	if profileDir != "" {
		if err := os.MkdirAll(profileDir, 0o755); err != nil {
			t.Fatal(err)
		}
		h.profiled = h.open.opened
		h.heapTop, h.goroutine, h.profileErr = p.profiles(profileDir, fmt.Sprintf("watchgate-%d", h.profiled))
		if h.profileErr != nil {
			t.Error(h.profileErr)
		}
		if first < n {
			more := f.open(t, n-first)
			h.open.opened += more.opened
			h.open.took += more.took
			h.open.retries += more.retries
			for k, v := range more.refused {
				h.open.refused[k] += v
			}
		}
	}
	t.Logf("held replica: opened %d of %d (refused %v, asked again %d)", h.open.opened, n, h.open.refused, h.open.retries)
	// At rest, then every second the oldest 1% end and as many open; the
	// oldest first lived past a budget's short-watch threshold (10s).
	time.Sleep(11 * time.Second)
	h.rest = p.sampleAfter(true)
	h.restWatches, _ = f.held(t)
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) {
		next := time.Now().Add(time.Second)
		k := max(1, n/100)
		f.close(t, k)
		o := f.open(t, k)
		h.reopened += o.opened
		for r, v := range o.refused {
			h.churnRefused[r] += v
		}
		time.Sleep(time.Until(next))
	}
	for _, l := range p.logLines("Cannot reach the API server", 5) {
		t.Log(l)
	}
	h.watches, h.ended = f.held(t)
	h.held = p.sampleAfter(true)
	h.peakRSS = peak()
	if h.peakRSS >= uint64(h.limit) {
		t.Errorf("peak RSS %d MiB reached the limit %d MiB", h.peakRSS>>20, h.limit>>20)
	}
	return h
}

func (h heldReplica) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| held replica: limit %d MiB, GOMEMLIMIT %d MiB, --max-watches %d | value |\n|---|---|\n", h.limit>>20, h.goMemLimit>>20, h.maxWatches)
	per := float64(max(1, h.restWatches))
	fmt.Fprintf(&b, "| watches opened at once / asked | %d / %d in %v (refused: %s; asked again, as client-go would: %d) |\n",
		h.open.opened, h.asked, h.open.took.Round(time.Millisecond), refusalText(h.open.refused), h.open.retries)
	fmt.Fprintf(&b, "| held %v, %d (1%%) closed and reopened each second: reopened / refused | %d / %s |\n", h.hold, max(1, h.asked/100), h.reopened, refusalText(h.churnRefused))
	fmt.Fprintf(&b, "| at rest before the churn: watches, RSS, Go heap in use (after a GC), goroutines, upstream connections | %d, %d MiB, %d MiB, %d, %d |\n",
		h.restWatches, h.rest.rss>>20, h.rest.heapInuse>>20, h.rest.goroutines, h.rest.upstream)
	fmt.Fprintf(&b, "| at rest before the churn, per watch: RSS, Go heap in use, goroutine stacks in use | %.1f KiB, %.1f KiB, %.1f KiB |\n",
		(float64(h.rest.rss)-float64(h.base.rss))/per/1024, (float64(h.rest.heapInuse)-float64(h.base.heapInuse))/per/1024,
		(float64(h.rest.stackInuse)-float64(h.base.stackInuse))/per/1024)
	fmt.Fprintf(&b, "| memory the watch guard counted at its last sample (watchgate_proxy_memory_in_use_bytes), per watch held | %d MiB, %.1f KiB |\n",
		h.rest.guarded>>20, float64(h.rest.guarded)/per/1024)
	fmt.Fprintf(&b, "| at the end: watches (ended by the server), RSS, Go heap in use (after a GC), goroutines | %d (%d), %d MiB, %d MiB, %d |\n",
		h.watches, h.ended, h.held.rss>>20, h.held.heapInuse>>20, h.held.goroutines)
	fmt.Fprintf(&b, "| peak RSS (limit %d MiB) | %d MiB |\n", h.limit>>20, h.peakRSS>>20)
	if h.heapTop != "" {
		fmt.Fprintf(&b, "| heap profile at %d watches, top in-use (flat) | %s |\n", h.profiled, h.heapTop)
		fmt.Fprintf(&b, "| goroutine profile at %d watches, largest stacks | %s |\n", h.profiled, h.goroutine)
	}
	return b.String()
}
