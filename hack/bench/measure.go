package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Kinds of measured work.
const (
	kindGet       = "get"
	kindOpen      = "open"
	kindJSON      = "json"
	kindProtobuf  = "protobuf"
	settleLimit   = 20 * time.Second
	settleWaitFor = 2 * time.Second
)

// stats is what one path accumulated over the rounds.
type stats struct {
	// latencies of GETs and watch opens.
	latencies map[string][]time.Duration
	// rates are events/s, one per replay, by encoding.
	rates map[string][]float64
	// work counts requests (get, open) or events (json, protobuf) whose
	// proxy CPU is in cpu; perUnit is each block's CPU per unit (one
	// block a round), whose median the report shows.
	work    map[string]int
	cpu     map[string]time.Duration
	perUnit map[string][]float64
	// atRest is the proxy's CPU per second of wall time while nothing
	// is asked of it (its own background work); 0 if not measured.
	atRest float64
	// rssPerWatch is the RSS growth per idle watch in bytes; 0 if not
	// measured.
	rssPerWatch float64
	rssBefore   int64
	rssAfter    int64
}

type results map[string]*stats

func newResults(ts []*target) results {
	r := results{}
	for _, t := range ts {
		r[t.name] = &stats{latencies: map[string][]time.Duration{}, rates: map[string][]float64{}, work: map[string]int{}, cpu: map[string]time.Duration{}, perUnit: map[string][]float64{}}
	}
	return r
}

// cpuOf reads t's proxy CPU; 0 for direct.
func cpuOf(t *target) (time.Duration, error) {
	if t.proc == nil {
		return 0, nil
	}
	return processCPU(t.proc.pid())
}

// block runs f, adds the proxy CPU it took to kind, and counts n units.
func block(t *target, s *stats, kind string, f func() (int, error)) error {
	before, err := cpuOf(t)
	if err != nil {
		return err
	}
	n, err := f()
	if err != nil {
		return err
	}
	after, err := cpuOf(t)
	if err != nil {
		return err
	}
	s.cpu[kind] += after - before
	s.work[kind] += n
	if t.proc != nil && n > 0 {
		s.perUnit[kind] = append(s.perUnit[kind], float64(after-before)/float64(n))
	}
	return nil
}

// measureAtRest records each proxy's CPU over d while nothing is asked of
// it, concurrently.
func measureAtRest(ts []*target, res results, d time.Duration) error {
	before := make([]time.Duration, len(ts))
	for i, t := range ts {
		c, err := cpuOf(t)
		if err != nil {
			return err
		}
		before[i] = c
	}
	start := time.Now()
	time.Sleep(d)
	wall := time.Since(start)
	for i, t := range ts {
		c, err := cpuOf(t)
		if err != nil {
			return err
		}
		res[t.name].atRest = float64(c-before[i]) / float64(wall)
		fmt.Printf("    %s: %.2f ms of CPU per second at rest\n", t.name, 1000*res[t.name].atRest)
	}
	return nil
}

// phases are a round's parts, in order; each path takes its turn at one
// phase before the next phase begins, so that what a path measures follows
// the same kind of work by another path, not that path's replays (whose
// garbage the process that ran them collects in the next block's span).
var phases = []func(ctx context.Context, t *target, res results, c config, rvGet string) error{gets, opens, replays}

// gets is one path's GETs of a round.
func gets(ctx context.Context, t *target, res results, c config, _ string) error {
	s := res[t.name]
	return block(t, s, kindGet, func() (int, error) {
		for range c.gets {
			d, err := t.get(ctx, objectPath(nsGet, "target"))
			if err != nil {
				return 0, err
			}
			s.latencies[kindGet] = append(s.latencies[kindGet], d)
		}
		return c.gets, nil
	})
}

// opens is one path's watch opens of a round.
func opens(ctx context.Context, t *target, res results, c config, rvGet string) error {
	s := res[t.name]
	return block(t, s, kindOpen, func() (int, error) {
		for range c.opens {
			d, err := t.watchOpen(ctx, collectionPath(nsGet), rvGet)
			if err != nil {
				return 0, err
			}
			s.latencies[kindOpen] = append(s.latencies[kindOpen], d)
		}
		return c.opens, nil
	})
}

// replays is one path's JSON and protobuf replays of a round.
func replays(ctx context.Context, t *target, res results, c config, _ string) error {
	s := res[t.name]
	for _, enc := range []struct{ kind, accept string }{{kindJSON, mediaJSON}, {kindProtobuf, mediaProto}} {
		if err := block(t, s, enc.kind, func() (int, error) {
			total := 0
			for range c.replays {
				n, d, err := t.replay(ctx, collectionPath(nsReplay), enc.accept)
				if err != nil {
					return 0, err
				}
				if n != c.objects {
					return 0, fmt.Errorf("%s: %s replay delivered %d ADDED events, want %d", t.name, enc.kind, n, c.objects)
				}
				s.rates[enc.kind] = append(s.rates[enc.kind], float64(n)/d.Seconds())
				total += n
			}
			return total, nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// measureIdle opens n idle watches through t's proxy on a transport of
// their own and records the proxy's settled RSS growth per watch; with
// profiles set, it saves heap profiles before and with the watches open.
func measureIdle(ctx context.Context, t *target, res results, ns, rv string, n int, profiles string) error {
	s := res[t.name]
	if err := collectGarbage(ctx, t); err != nil {
		return err
	}
	before, err := settledRSS(t.proc.pid(), settleLimit)
	if err != nil {
		return err
	}
	if err := heapProfiles(ctx, t, profiles, "before"); err != nil {
		return err
	}
	rt := newTransport(tokenOf(t), nil)
	iw, err := t.openIdle(ctx, rt, collectionPath(ns), rv, n)
	if err != nil {
		return err
	}
	time.Sleep(settleWaitFor)
	err = collectGarbage(ctx, t)
	var after int64
	if err == nil {
		after, err = settledRSS(t.proc.pid(), settleLimit)
	}
	if err == nil {
		err = heapProfiles(ctx, t, profiles, "idle")
	}
	iw.close()
	if err != nil {
		return err
	}
	s.rssBefore, s.rssAfter = before, after
	s.rssPerWatch = float64(after-before) / float64(n)
	fmt.Printf("    %s: RSS %.1f MiB → %.1f MiB with %d idle watches: %.1f KiB per watch\n",
		t.name, float64(before)/(1<<20), float64(after)/(1<<20), n, s.rssPerWatch/1024)
	// Let the API server and the proxy drop the closed watches.
	time.Sleep(settleWaitFor)
	return nil
}

// collectGarbage makes t's proxy run a garbage collection (its pprof
// heap endpoint with gc=1), so that both proxies' RSS is read in the same
// state: the garbage of opening the watches collected, as the runtime's
// forced collection every two minutes would leave it. Without it, RSS
// depended on how far each heap happened to be from its next collection:
// the bare proxy's RSS per watch moved between 26.8 and 33.8 KiB from one
// run to the next.
func collectGarbage(ctx context.Context, t *target) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+t.pprof+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: collect garbage: %w", t.name, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: collect garbage: %s", t.name, resp.Status)
	}
	return nil
}

// heapProfiles saves t's heap profile, after a GC, and its MemStats
// into dir as <name>-<when>.pb.gz and .txt; nothing when dir is empty.
func heapProfiles(ctx context.Context, t *target, dir, when string) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(dir, strings.ReplaceAll(t.name, " ", "-")+"-"+when)
	if err := fetchProfile(ctx, "http://"+t.pprof+"/debug/pprof/heap?gc=1", base+".pb.gz"); err != nil {
		return err
	}
	return fetchProfile(ctx, "http://"+t.pprof+"/debug/pprof/heap?debug=1", base+".txt")
}

func tokenOf(t *target) string {
	if tt, ok := t.rt.(tokenTransport); ok {
		return tt.token
	}
	return ""
}

// percentile returns the p-th percentile (0 < p ≤ 100, nearest rank).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func median(fs []float64) float64 {
	if len(fs) == 0 {
		return 0
	}
	s := slices.Clone(fs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func numCPU() int { return runtime.NumCPU() }
