//go:build load

package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/watchgate/watchgate/test/apiserver"
)

// requestTrace records, for every request a client sends, when it
// started, how long it waited for a connection, and when the answer's
// headers came, so that a slow sync can be told apart into waiting for a
// connection, for the server's answer, or for the stream after it.
type requestTrace struct {
	mu   sync.Mutex
	reqs []*tracedRequest
}

type tracedRequest struct {
	what             string // method, label selector, watch or list
	start            time.Time
	gotConn, headers time.Duration
	reused           bool
	status           string
}

func (r *requestTrace) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		q := req.URL.Query()
		what := req.Method + " " + q.Get("labelSelector")
		if q.Get("watch") == "true" || q.Get("watch") == "1" {
			what += " watch"
			if q.Get("sendInitialEvents") == "true" {
				what += "-list"
			}
		}
		tr := &tracedRequest{what: what, start: time.Now()}
		ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) {
				tr.gotConn, tr.reused = time.Since(tr.start), i.Reused
			},
		})
		resp, err := next.RoundTrip(req.WithContext(ctx))
		tr.headers = time.Since(tr.start)
		if err != nil {
			tr.status = "error " + err.Error()
		} else {
			tr.status = strconv.Itoa(resp.StatusCode)
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, tr)
		r.mu.Unlock()
		return resp, err
	})
}

// since returns the requests started at or after t, slowest answer first.
func (r *requestTrace) since(t time.Time) []*tracedRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracedRequest
	for _, q := range r.reqs {
		if !q.start.Before(t) {
			out = append(out, q)
		}
	}
	slices.SortFunc(out, func(a, b *tracedRequest) int { return int(b.headers - a.headers) })
	return out
}

// summary says how many requests a restart sent and the slowest few.
func (r *requestTrace) summary(t time.Time, n int) string {
	reqs := r.since(t)
	kinds := map[string]int{}
	for _, q := range reqs {
		f := strings.Fields(q.what)
		kinds[f[0]+" "+strings.Join(f[min(2, len(f)):], " ")+" "+q.status]++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests %v;", len(reqs), kinds)
	for _, q := range reqs[:min(n, len(reqs))] {
		fmt.Fprintf(&b, " [%s at +%v: conn %v reused=%v, headers %v, %s]", q.what, q.start.Sub(t).Round(time.Millisecond),
			q.gotConn.Round(time.Millisecond), q.reused, q.headers.Round(time.Millisecond), q.status)
	}
	return b.String()
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// cpuTimes reads the CPU time (user + system) of the processes named,
// children of this test or this test itself, and the machine's busy time.
type cpuTimes map[string]time.Duration

const clockTick = 100 // USER_HZ, on every Linux the test bed runs on

func readCPU(pids map[string]int) cpuTimes {
	out := cpuTimes{}
	for name, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		// utime and stime are fields 14 and 15 of stat, 12 and 13 after ") ".
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		out[name] = time.Duration(u+st) * time.Second / clockTick
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
		var busy int64
		for i, v := range f[1:] {
			n, _ := strconv.ParseInt(v, 10, 64)
			if i != 3 && i != 4 { // idle, iowait
				busy += n
			}
		}
		out["machine"] = time.Duration(busy) * time.Second / clockTick
	}
	return out
}

func (c cpuTimes) minus(o cpuTimes) string {
	var parts []string
	for _, k := range sortedKeys(c) {
		parts = append(parts, fmt.Sprintf("%s %.2fs", k, (c[k]-o[k]).Seconds()))
	}
	return strings.Join(parts, ", ")
}

// childPids finds this test's child processes by command name.
func childPids(names ...string) map[string]int {
	out := map[string]int{"test": os.Getpid()}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		comm := s[open+1 : closing]
		f := strings.Fields(s[closing+2:])
		ppid, _ := strconv.Atoi(f[1])
		pid, _ := strconv.Atoi(filepath.Base(d))
		if ppid == os.Getpid() && slices.Contains(names, comm) {
			out[comm] = pid
		}
	}
	return out
}

// histogramDelta is the count and mean of the histograms in family (whose
// labels include match) between two scrapes, by the value of label.
func histogramDelta(after, before map[string]*dto.MetricFamily, family, label string, match map[string]string) string {
	na, sa := apiserver.HistogramBy(after, family, label, match)
	nb, sb := apiserver.HistogramBy(before, family, label, match)
	var parts []string
	for _, k := range sortedKeys(na) {
		if d := na[k] - nb[k]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s n=%d mean=%.3fs", k, d, (sa[k]-sb[k])/float64(d)))
		}
	}
	return strings.Join(parts, ", ")
}

// spreadOf is the fastest, median and slowest of ds.
func spreadOf(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Sorted(slices.Values(ds))
	return fmt.Sprintf("fastest %v, median %v, slowest %v", s[0].Round(time.Millisecond), s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// counterDelta is the growth of the counters in family between two
// scrapes, by the value of label.
func counterDelta(after, before map[string]*dto.MetricFamily, family, label string) map[string]float64 {
	a, b := apiserver.SumBy(after, family, label, nil), apiserver.SumBy(before, family, label, nil)
	out := map[string]float64{}
	for k, v := range a {
		if d := v - b[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// seatSampler reads the replica's watch-open seat limit
// (watchgate_proxy_watch_open_seats) every 25 ms until stopped, and
// answers the fewest and the most it saw: whether a slow restart waited
// on a shrunk limit.
func seatSampler(url string) (stop func() string) {
	done := make(chan struct{})
	var lo, hi float64
	var seen int
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			if fams, err := scrape(url); err == nil {
				if f := fams["watchgate_proxy_watch_open_seats"]; f != nil && len(f.GetMetric()) > 0 {
					v := f.GetMetric()[0].GetGauge().GetValue()
					if seen == 0 || v < lo {
						lo = v
					}
					hi = max(hi, v)
					seen++
				}
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	return func() string {
		close(done)
		wg.Wait()
		if seen == 0 {
			return "not read"
		}
		return fmt.Sprintf("%.0f–%.0f over %d samples", lo, hi, seen)
	}
}
