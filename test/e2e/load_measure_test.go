//go:build load

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watchgate/watchgate/test/apiserver"
)

// loadRun is what one proxy did with the side-by-side load.
type loadRun struct {
	name string
	// base is the proxy before the watches, rest with them, at rest.
	base, rest sample
	open       opening
	// openCPU is the proxy's CPU (seconds) while the watches opened,
	// restCPU its CPU at rest (cores).
	openCPU, restCPU float64
	// writes (failed) the writer made; latencies of the events delivered,
	// sorted; errorEvents the ERROR events the clients saw; control the
	// latencies, over the same span, of watches straight to the API
	// server.
	writes, writesFailed, errorEvents int
	latencies, control                []time.Duration
	// eventCPU is the proxy's CPU per delivered event (seconds), net of
	// its CPU at rest; eventCPUGross is not. apiEventCPU is the API
	// server's CPU per delivered event, gross, and eventBusy the machine's
	// CPUs busy (of all of them) while the events are delivered.
	eventCPU, eventCPUGross, apiEventCPU, eventBusy float64
	// ended is the watches the server ended during the run.
	ended int
}

// restSettle is how long the watches settle after opening, restSpan
// how long CPU at rest is measured, and eventTail how long each slice of
// events waits for its last writes' events.
const (
	restSettle = 10 * time.Second
	restSpan   = 30 * time.Second
	eventTail  = time.Second
)

// measureOpen opens n watches through p with f all at once, measures p at
// rest, then closes the watches and stops f.
func measureOpen(t *testing.T, p *process, f *fleet, n int) loadRun {
	t.Helper()
	defer f.stop()
	var r loadRun
	r.base = p.sampleAfter(true)
	c0 := p.cpu()
	r.open = f.open(t, n)
	r.openCPU = p.cpu() - c0
	t.Logf("%s: opened %d of %d in %v (refused %v, asked again %d)", p.url, r.open.opened, n, r.open.took, r.open.refused, r.open.retries)
	for _, l := range p.logLines("Cannot reach the API server", 3) {
		t.Log(l)
	}
	time.Sleep(restSettle)
	c1 := p.cpu()
	time.Sleep(restSpan)
	r.restCPU = (p.cpu() - c1) / restSpan.Seconds()
	r.rest = p.sampleAfter(true)
	f.close(t, r.open.opened)
	return r
}

// eventPath is one path's part in the interleaved events: its proxy, the
// watches open through it, their ConfigMaps, and the control, watches
// straight to the API server on the first of the same ConfigMaps.
type eventPath struct {
	p        *process
	watches  *fleet
	opened   int
	objs     loadObjects
	control  *fleet
	name     string
	run      *loadRun
	apiGross float64
}

// collect adds the latencies the path's watches and its control received
// since the last collect to its run, and returns them (sorted).
func (ep *eventPath) collect(t *testing.T) (watches, control []time.Duration) {
	t.Helper()
	r := ep.run
	watches, errs := ep.watches.latencies(t)
	r.latencies = append(r.latencies, watches...)
	r.errorEvents += errs
	control, _ = ep.control.latencies(t)
	r.control = append(r.control, control...)
	return watches, control
}

// interleavedEvents delivers deliveries events a second to each path's
// watches for d in all, in turns: rounds rounds, each a slice of
// d ÷ rounds per path (then eventTail for its last events; any later
// ones count at the path's next slice, or at the end), the order of
// the paths rotating by one each round, so that whatever drifts in the API
// server or the machine over the phase falls on every path alike. Every
// path's watches and control stay open throughout; a slice writes only its
// path's ConfigMaps, so the other paths' watches get no events. Each run
// gets its latencies and its control's, and its proxy's and the API
// server's CPU per event over its slices (the proxy's net of its CPU at
// rest, run.restCPU).
//
// With profileDir set, it writes the CPU profiles of watchgate and of the
// API server over each path's first slice, as <name>-events.pprof and
// <name>-apiserver-events.pprof.
func interleavedEvents(t *testing.T, ctx context.Context, e *apiserver.Env, paths []*eventPath, deliveries int, d time.Duration, rounds int, profileDir string) {
	t.Helper()
	slice := d / time.Duration(rounds)
	api := apiServerProcess(t, e)
	// Per path, over its slices: seconds, machine CPU busy, its proxy's CPU.
	span, busy, gross := make([]float64, len(paths)), make([]float64, len(paths)), make([]float64, len(paths))
	for round := range rounds {
		for k := range paths {
			i := (k + round) % len(paths)
			ep := paths[i]
			r := ep.run
			ep.collect(t) // its previous slice's latest events
			// Each write reaches the watches of its group: opened ÷ groups.
			perWrite := max(1, float64(ep.opened)/float64(ep.objs.groups))
			var profiled chan error
			if profileDir != "" && round == 0 {
				profiled = make(chan error, 2)
				go func() {
					profiled <- apiServerCPUProfile(ctx, e, filepath.Join(profileDir, ep.name+"-apiserver-events.pprof"), slice)
				}()
				if ep.p.bare {
					profiled <- nil
				} else {
					go func() { profiled <- ep.p.cpuProfile(filepath.Join(profileDir, ep.name+"-events.pprof"), slice) }()
				}
			}
			c0, a0, m0, t0 := ep.p.cpu(), api.cpu(), readCPU(nil)["machine"], time.Now()
			w, failed := ep.objs.write(ctx, e.Clientset, float64(deliveries)/perWrite, slice)
			time.Sleep(eventTail)
			elapsed := time.Since(t0).Seconds()
			gross[i] += ep.p.cpu() - c0
			ep.apiGross += api.cpu() - a0
			busy[i] += (readCPU(nil)["machine"] - m0).Seconds()
			span[i] += elapsed
			r.writes += w
			r.writesFailed += failed
			if profiled != nil {
				for range 2 {
					if err := <-profiled; err != nil {
						t.Logf("CPU profile during the events: %v", err)
					}
				}
			}
			lat, c := ep.collect(t)
			t.Logf("round %d, %s: %d events, latency p50 %v p99 %v; control %d events, p50 %v p99 %v", round, ep.name,
				len(lat), quantile(lat, 0.5).Round(100*time.Microsecond), quantile(lat, 0.99).Round(100*time.Microsecond),
				len(c), quantile(c, 0.5).Round(100*time.Microsecond), quantile(c, 0.99).Round(100*time.Microsecond))
		}
	}
	time.Sleep(eventTail)
	for i, ep := range paths {
		ep.collect(t)
		r := ep.run
		slices.Sort(r.latencies)
		slices.Sort(r.control)
		r.eventBusy = busy[i] / span[i] / float64(runtime.NumCPU())
		if n := float64(len(r.latencies)); n > 0 {
			r.eventCPU = (gross[i] - r.restCPU*span[i]) / n
			r.eventCPUGross = gross[i] / n
			r.apiEventCPU = ep.apiGross / n
		}
		_, r.ended = ep.watches.held(t)
	}
}

// sideBySide is the table of the side-by-side runs, the bare proxy last,
// with each watchgate's ratio to it; the events' rows when there were
// events.
func sideBySide(runs [3]loadRun, n int, events bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| %d watches opened at once | %s | %s | %s | ratio %s | ratio %s |\n|---|---|---|---|---|---|\n",
		n, runs[0].name, runs[1].name, runs[2].name, "(1) ÷ bare", "(2) ÷ bare")
	kib := func(v float64) string { return fmt.Sprintf("%.1f KiB", v/1024) }
	mib := func(v float64) string { return fmt.Sprintf("%.0f MiB", v/(1<<20)) }
	count := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	dur := func(v float64) string { return time.Duration(v).Round(time.Millisecond).String() }
	lat := func(v float64) string { return time.Duration(v).Round(100 * time.Microsecond).String() }
	times := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	overControl := func(r loadRun, q float64) float64 {
		if c := quantile(r.control, q); c > 0 {
			return float64(quantile(r.latencies, q)) / float64(c)
		}
		return 0
	}
	micro := func(v float64) string { return fmt.Sprintf("%.1f µs", v*1e6) }
	perWatch := func(r loadRun) float64 { return float64(max(1, r.open.opened)) }
	rows := []sideRow{
		{"watches held", func(r loadRun) float64 { return float64(r.open.opened) }, count, false},
		{"time to open them all", func(r loadRun) float64 { return float64(r.open.took) }, dur, true},
		{"proxy CPU to open, per watch", func(r loadRun) float64 { return r.openCPU / perWatch(r) }, micro, true},
		{"RSS at rest", func(r loadRun) float64 { return float64(r.rest.rss) }, mib, true},
		{"RSS per watch", func(r loadRun) float64 { return (float64(r.rest.rss) - float64(r.base.rss)) / perWatch(r) }, kib, true},
		{"Go heap in use (after a GC)", func(r loadRun) float64 { return float64(r.rest.heapInuse) }, mib, true},
		{"Go heap in use per watch", func(r loadRun) float64 {
			return (float64(r.rest.heapInuse) - float64(r.base.heapInuse)) / perWatch(r)
		}, kib, true},
		{"goroutine stacks in use per watch", func(r loadRun) float64 {
			return (float64(r.rest.stackInuse) - float64(r.base.stackInuse)) / perWatch(r)
		}, kib, true},
		{"goroutines", func(r loadRun) float64 { return float64(r.rest.goroutines) }, count, true},
		{"CPU at rest (cores)", func(r loadRun) float64 { return r.restCPU }, func(v float64) string { return fmt.Sprintf("%.3f", v) }, false},
	}
	eventRows := []sideRow{
		{"events delivered", func(r loadRun) float64 { return float64(len(r.latencies)) }, count, false},
		{"delivery latency p50", func(r loadRun) float64 { return float64(quantile(r.latencies, 0.50)) }, lat, true},
		{"delivery latency p99", func(r loadRun) float64 { return float64(quantile(r.latencies, 0.99)) }, lat, true},
		{"control: latency p50 of watches straight to the API server in the same span", func(r loadRun) float64 { return float64(quantile(r.control, 0.50)) }, lat, false},
		{"control: latency p99 of watches straight to the API server in the same span", func(r loadRun) float64 { return float64(quantile(r.control, 0.99)) }, lat, false},
		{"delivery latency p50 ÷ the control's", func(r loadRun) float64 { return overControl(r, 0.50) }, times, true},
		{"delivery latency p99 ÷ the control's", func(r loadRun) float64 { return overControl(r, 0.99) }, times, true},
		{"proxy CPU per event", func(r loadRun) float64 { return r.eventCPUGross }, micro, true},
		{"proxy CPU per event, net of CPU at rest", func(r loadRun) float64 { return r.eventCPU }, micro, true},
		{"API server CPU per event", func(r loadRun) float64 { return r.apiEventCPU }, micro, true},
		{"machine CPU busy during the events", func(r loadRun) float64 { return r.eventBusy }, func(v float64) string { return fmt.Sprintf("%.0f%%", v*100) }, false},
	}
	if events {
		rows = append(rows, eventRows...)
	}
	for _, row := range rows {
		bare := row.val(runs[2])
		fmt.Fprintf(&b, "| %s | %s | %s | %s |", row.name, row.format(row.val(runs[0])), row.format(row.val(runs[1])), row.format(bare))
		for _, r := range runs[:2] {
			if row.ratio && bare > 0 {
				fmt.Fprintf(&b, " %.2f× |", row.val(r)/bare)
			} else {
				b.WriteString(" – |")
			}
		}
		b.WriteString("\n")
	}
	text := func(name string, f func(loadRun) string) {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | – | – |\n", name, f(runs[0]), f(runs[1]), f(runs[2]))
	}
	text("refused (reason × count); requests asked again, as an informer would", func(r loadRun) string {
		return fmt.Sprintf("%s; %d", refusalText(r.open.refused), r.open.retries)
	})
	text("upstream connections (watchgate_proxy_upstream_connections; the bare proxy's sockets to the API server)", func(r loadRun) string {
		return fmt.Sprint(r.rest.upstream)
	})
	text("writes (failed), ERROR events, watches the server ended", func(r loadRun) string {
		return fmt.Sprintf("%d (%d), %d, %d", r.writes, r.writesFailed, r.errorEvents, r.ended)
	})
	return b.String()
}

// sideRow is one row of sideBySide: its name, the figure of a run and its
// format, and whether a ratio to the bare proxy's means anything.
type sideRow struct {
	name   string
	val    func(loadRun) float64
	format func(float64) string
	ratio  bool
}
