package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Markers of the block the harness owns in BENCHMARKS.md.
const (
	beginMarker = "<!-- make bench: begin (written by hack/bench, do not edit) -->"
	endMarker   = "<!-- make bench: end -->"
)

type report struct {
	command                 string
	started                 time.Time
	machine                 string
	commit                  string
	config                  config
	results                 results
	direct, bare, watchgate string
}

// row is one figure: its values by path, how to print them, and a target
// on watchgate ÷ bare (atMost, or atLeast when lower is worse; 0: none,
// the figure is for reading only).
type row struct {
	name    string
	unit    string
	values  [3]float64 // direct, bare, watchgate; NaN-free, 0 = not measured
	target  float64
	atLeast bool
	// proxiesOnly: the proxies' 0 is a measurement (printed 0), only
	// direct is "not measured".
	proxiesOnly bool
}

func (r report) rows() []row {
	get := func(name string) *stats { return r.results[name] }
	paths := []string{r.direct, r.bare, r.watchgate}
	lat := func(kind string, p float64) (v [3]float64) {
		for i, n := range paths {
			v[i] = float64(percentile(get(n).latencies[kind], p)) / float64(time.Millisecond)
		}
		return v
	}
	rate := func(kind string) (v [3]float64) {
		for i, n := range paths {
			v[i] = median(get(n).rates[kind])
		}
		return v
	}
	cpu := func(kind string) (v [3]float64) {
		for i, n := range paths[1:] {
			v[i+1] = median(get(n).perUnit[kind]) / float64(time.Microsecond)
		}
		return v
	}
	var rest [3]float64
	for i, n := range paths[1:] {
		rest[i+1] = 1000 * get(n).atRest
	}
	var mem [3]float64
	for i, n := range paths[1:] {
		mem[i+1] = get(n).rssPerWatch / 1024
	}
	return []row{
		{name: "GET one config map, p50", unit: "ms", values: lat(kindGet, 50), target: 1.15},
		{name: "GET one config map, p99", unit: "ms", values: lat(kindGet, 99), target: 1.15},
		{name: "watch open (to headers), p50", unit: "ms", values: lat(kindOpen, 50), target: 1.15},
		{name: "watch open (to headers), p99", unit: "ms", values: lat(kindOpen, 99), target: 1.15},
		{name: fmt.Sprintf("replay of %d objects, JSON, median", r.config.objects), unit: "events/s", values: rate(kindJSON), target: 0.95, atLeast: true},
		{name: fmt.Sprintf("replay of %d objects, protobuf, median", r.config.objects), unit: "events/s", values: rate(kindProtobuf), target: 0.95, atLeast: true},
		{name: "proxy CPU per GET", unit: "µs", values: cpu(kindGet), target: 1.15},
		{name: "proxy CPU per watch open (and close)", unit: "µs", values: cpu(kindOpen), target: 1.15},
		{name: "proxy CPU per JSON event", unit: "µs", values: cpu(kindJSON), target: 1.15},
		{name: "proxy CPU per protobuf event", unit: "µs", values: cpu(kindProtobuf), target: 1.15},
		{name: fmt.Sprintf("proxy RSS per idle watch (%d open)", r.config.idle), unit: "KiB", values: mem, target: 1.25},
		{name: fmt.Sprintf("proxy CPU at rest (%s, nothing asked)", restFor), unit: "ms/s", values: rest, proxiesOnly: true},
	}
}

// proxyValue formats the bare proxy's (i = 1) or watchgate's (2) value.
func (r row) proxyValue(i int) string {
	if r.proxiesOnly && r.values[i] == 0 {
		return "0"
	}
	return format(r.values[i])
}

func format(v float64) string {
	switch {
	case v == 0:
		return "—"
	case v >= 1000:
		return commas(int64(v + 0.5))
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func commas(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// markdown is the block written into BENCHMARKS.md.
func (r report) markdown() string {
	var b strings.Builder
	c := r.config
	fmt.Fprintf(&b, "Command: `%s` (hack/bench: %d rounds, paths interleaved phase by phase; per path per round %d GETs, %d watch opens, %d JSON and %d protobuf replays; %d idle watches per proxy). Latencies are percentiles over all rounds, events/s the median replay, proxy CPU (the scheduler's ns of all its threads) the median of the rounds' per-unit figures.\n",
		r.command, c.rounds, c.gets, c.opens, c.replays, c.replays, c.idle)
	fmt.Fprintf(&b, "Measured %s (%s) on commit %s; machine: %s.\n\n",
		r.started.Format("2006-01-02 15:04 UTC"), time.Since(r.started).Round(time.Second), r.commit, r.machine)
	b.WriteString("| figure | unit | direct | bare proxy | watchgate | watchgate ÷ bare | target | met |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.rows() {
		ratio, met, target := "—", "—", "—"
		op := "≤"
		if row.atLeast {
			op = "≥"
		}
		if row.target > 0 {
			target = fmt.Sprintf("%s %.2f×", op, row.target)
		}
		if row.values[1] > 0 && row.values[2] > 0 {
			q := row.values[2] / row.values[1]
			ratio = fmt.Sprintf("%.2f", q)
		}
		if row.values[1] > 0 && row.values[2] > 0 && row.target > 0 {
			q := row.values[2] / row.values[1]
			ok := q <= row.target
			if row.atLeast {
				ok = q >= row.target
			}
			met = map[bool]string{true: "yes", false: "**no**"}[ok]
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n",
			row.name, row.unit, format(row.values[0]), row.proxyValue(1), row.proxyValue(2), ratio, target, met)
	}
	return b.String()
}

// writeBlock replaces the marked block of path with table, or appends a
// "## make bench" section holding it when the markers are missing.
func writeBlock(path, table string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(old)
	block := beginMarker + "\n" + table + endMarker
	i, j := strings.Index(s, beginMarker), strings.Index(s, endMarker)
	switch {
	case i >= 0 && j > i:
		s = s[:i] + block + s[j+len(endMarker):]
	case i < 0 && j < 0:
		s = strings.TrimRight(s, "\n") + "\n\n## make bench\n\n" + block + "\n"
	default:
		return fmt.Errorf("%s: the make bench markers are broken; fix them by hand", path)
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

// commit names the checked-out commit, and says so when the tree has
// uncommitted changes other than BENCHMARKS.md, which the harness itself
// writes (a second run after a first would otherwise name its commit as
// changed).
func commit(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!BENCHMARKS.md").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += " (with uncommitted changes)"
	}
	return c
}
