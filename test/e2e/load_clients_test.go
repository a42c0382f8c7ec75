//go:build load

package e2e

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// defaultWatchesPerClient is how many watches one loadclient process
// holds at most (LOAD_CLIENT_WATCHES sets another: a few hundred runs
// the fleet of several processes at a small LOAD_WATCHES), and
// clientStreamsPerConnection how many it puts on one HTTP/2 connection (the
// proxies allow 1,000). At 100,000 watches that is 8 processes of 25
// connections each: no process nears its file limit, and the 200
// connections leave the loopback's ephemeral ports alone.
const (
	defaultWatchesPerClient    = 12500
	clientStreamsPerConnection = 500
)

// fleetSize is how many loadclient processes hold n watches, at most
// perClient each, and how many each holds.
func fleetSize(n, perClient int) (procs, per int) {
	procs = max(1, (n+perClient-1)/perClient)
	return procs, (n + procs - 1) / procs
}

// fleet is the load client: several loadclient processes
// (testdata/loadclient), each holding its share of the watches over its own
// HTTP/2 connections, driven over their stdin and stdout.
type fleet struct {
	procs []*loadClient
}

// loadClient is one loadclient process; one command at a time.
type loadClient struct {
	mu  sync.Mutex
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// clientShape says which watches the fleet opens: see loadclient's doc.
type clientShape struct {
	token              string
	prefix             string
	groups, namespaces int
}

// startFleet starts enough loadclient processes (bin) for n watches against
// url; watch k of the fleet is k mod shape.groups's group.
func startFleet(t *testing.T, bin, url string, n int, shape clientShape) *fleet {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(shape.token), 0o600); err != nil {
		t.Fatal(err)
	}
	procs, per := fleetSize(n, envInt("LOAD_CLIENT_WATCHES", defaultWatchesPerClient))
	f := &fleet{}
	t.Cleanup(f.stop)
	for i := range procs {
		cmd := exec.Command(bin, "--url="+url, "--token-file="+tokenFile, "--namespace-prefix="+shape.prefix,
			fmt.Sprintf("--namespaces=%d", shape.namespaces), fmt.Sprintf("--groups=%d", shape.groups),
			fmt.Sprintf("--first=%d", i*per), fmt.Sprintf("--connections=%d", max(1, (per+clientStreamsPerConnection-1)/clientStreamsPerConnection)),
			"--lifetime=1h")
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = testWriter{t}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 256<<20)
		f.procs = append(f.procs, &loadClient{cmd: cmd, in: in, out: sc})
	}
	return f
}

// testWriter logs a process's stderr into the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("loadclient: %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

// do sends one command and answers its one line.
func (c *loadClient) do(command string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := fmt.Fprintln(c.in, command); err != nil {
		return "", err
	}
	line := make(chan string, 1)
	go func() {
		if c.out.Scan() {
			line <- c.out.Text()
		}
		close(line)
	}()
	select {
	case l, ok := <-line:
		if !ok {
			err := c.out.Err()
			if err == nil {
				err = io.EOF // it closed its stdout; its stderr, in the test's log, says why
			}
			return "", fmt.Errorf("loadclient exited during %q: %w", command, err)
		}
		return l, nil
	case <-time.After(15 * time.Minute):
		_ = c.cmd.Process.Kill()
		return "", fmt.Errorf("loadclient did not answer %q in 15m", command)
	}
}

// each sends every process its command, at once, and answers their lines.
func (f *fleet) each(t *testing.T, command func(i int) string) []string {
	t.Helper()
	lines := make([]string, len(f.procs))
	errs := make([]error, len(f.procs))
	var wg sync.WaitGroup
	for i, c := range f.procs {
		wg.Go(func() { lines[i], errs[i] = c.do(command(i)) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return lines
}

// share splits k over the processes.
func (f *fleet) share(k, i int) int {
	n := len(f.procs)
	return k/n + btoi(i < k%n)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// opening is what one open of the fleet did.
type opening struct {
	opened  int
	took    time.Duration // the slowest process's
	retries int           // requests asked again, as client-go would (after a Retry-After or a transport error)
	refused map[string]int
}

// open opens k watches spread over the processes, all at once.
func (f *fleet) open(t *testing.T, k int) opening {
	t.Helper()
	o := opening{refused: map[string]int{}}
	for _, l := range f.each(t, func(i int) string { return fmt.Sprintf("open %d", f.share(k, i)) }) {
		fs := strings.Fields(l)
		if len(fs) < 4 || fs[0] != "opened" {
			t.Fatalf("loadclient answered %q to open", l)
		}
		n, _ := strconv.Atoi(fs[1])
		ns, _ := strconv.ParseInt(fs[2], 10, 64)
		o.opened += n
		retries, _ := strconv.Atoi(fs[3])
		o.took = max(o.took, time.Duration(ns))
		o.retries += retries
		for _, r := range fs[4:] {
			reason, v, _ := strings.Cut(r, "=")
			c, _ := strconv.Atoi(v)
			o.refused[reason] += c
		}
	}
	return o
}

// close ends the k oldest watches, spread over the processes.
func (f *fleet) close(t *testing.T, k int) {
	t.Helper()
	f.each(t, func(i int) string { return fmt.Sprintf("close %d", f.share(k, i)) })
}

// held answers the watches open and those the server ended.
func (f *fleet) held(t *testing.T) (open, ended int) {
	t.Helper()
	for _, l := range f.each(t, func(int) string { return "held" }) {
		var o, e int
		if _, err := fmt.Sscanf(l, "held %d %d", &o, &e); err != nil {
			t.Fatalf("loadclient answered %q to held", l)
		}
		open += o
		ended += e
	}
	return open, ended
}

// latencies answers the delivery latencies (sorted) and ERROR events seen
// since the last call.
func (f *fleet) latencies(t *testing.T) (sorted []time.Duration, errors int) {
	t.Helper()
	for _, l := range f.each(t, func(int) string { return "lat" }) {
		fs := strings.Fields(l)
		if len(fs) < 3 || fs[0] != "lat" {
			t.Fatalf("loadclient answered %q to lat", l[:min(len(l), 100)])
		}
		e, _ := strconv.Atoi(fs[2])
		errors += e
		for _, v := range fs[3:] {
			us, _ := strconv.ParseInt(v, 10, 64)
			sorted = append(sorted, time.Duration(us)*time.Microsecond)
		}
	}
	slices.Sort(sorted)
	return sorted, errors
}

// stop ends every process: stdin closed, then killed after 2 minutes.
func (f *fleet) stop() {
	var wg sync.WaitGroup
	for _, c := range f.procs {
		wg.Go(func() {
			_ = c.in.Close()
			done := make(chan struct{})
			go func() { _ = c.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				_ = c.cmd.Process.Kill()
				<-done
			}
		})
	}
	wg.Wait()
	f.procs = nil
}

// quantile answers the q-quantile of sorted (nearest rank), 0 when empty.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// refusalText prints refusals by reason in a fixed order, "none" if none.
func refusalText(r map[string]int) string {
	if len(r) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r)) {
		parts = append(parts, fmt.Sprintf("%s × %d", k, r[k]))
	}
	return strings.Join(parts, ", ")
}

// fleetSize splits watches over as few processes as hold them, evenly:
// LOAD_CLIENT_WATCHES=500 runs 2,000 watches in 4 processes, and 100,000
// take 8 at the default.
func TestFleetSize(t *testing.T) {
	for _, tc := range []struct{ n, perClient, procs, per int }{
		{2000, 500, 4, 500},
		{100000, defaultWatchesPerClient, 8, 12500},
		{10000, defaultWatchesPerClient, 1, 10000},
		{25001, defaultWatchesPerClient, 3, 8334},
		{0, defaultWatchesPerClient, 1, 0},
	} {
		if procs, per := fleetSize(tc.n, tc.perClient); procs != tc.procs || per != tc.per || procs*per < tc.n {
			t.Errorf("fleetSize(%d, %d) = %d processes of %d, want %d of %d", tc.n, tc.perClient, procs, per, tc.procs, tc.per)
		}
	}
}
