package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWriteBlockReplacesOnlyTheMarkedBlock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	before := "# Benchmarks\n\n## make bench\n\nintro\n\n" + beginMarker + "\nold table\n" + endMarker + "\n\nnotes\n"
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeBlock(path, "new table\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	want := "# Benchmarks\n\n## make bench\n\nintro\n\n" + beginMarker + "\nnew table\n" + endMarker + "\n\nnotes\n"
	if string(b) != want {
		t.Errorf("got\n%s\nwant\n%s", b, want)
	}
}

func TestWriteBlockAppendsASectionWhenMarkersAreMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	if err := os.WriteFile(path, []byte("# Benchmarks\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeBlock(path, "table\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if !strings.HasSuffix(string(b), "## make bench\n\n"+beginMarker+"\ntable\n"+endMarker+"\n") {
		t.Errorf("no section appended:\n%s", b)
	}
}

func TestWriteBlockRefusesBrokenMarkers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	if err := os.WriteFile(path, []byte(endMarker+"\n"+beginMarker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeBlock(path, "table\n"); err == nil {
		t.Error("markers in the wrong order were accepted")
	}
}

func TestPercentileIsNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if got := percentile(ds, 50); got != 50*time.Millisecond {
		t.Errorf("p50 = %s, want 50ms", got)
	}
	if got := percentile(ds, 99); got != 99*time.Millisecond {
		t.Errorf("p99 = %s, want 99ms", got)
	}
	if got := percentile(nil, 99); got != 0 {
		t.Errorf("p99 of nothing = %s, want 0", got)
	}
}

func TestOwnProcessCPUAndRSSAreRead(t *testing.T) {
	pid := os.Getpid()
	before, err := processCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if after, _ := processCPU(pid); after > before {
			break
		}
	}
	after, err := processCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("CPU did not advance while spinning: %s → %s", before, after)
	}
	// The two sources agree within the ticks' resolution.
	sched, err1 := schedCPU(pid)
	stat, err2 := statCPU(pid)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if d := sched - stat; d < -50*time.Millisecond || d > 50*time.Millisecond {
		t.Errorf("schedstat says %s, stat %s", sched, stat)
	}
	rss, err := processRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	if rss < 1<<20 {
		t.Errorf("RSS %d bytes: not read", rss)
	}
}

// At rest, a proxy that used no CPU shows 0, not "not measured".
func TestAtRestZeroIsPrinted(t *testing.T) {
	r := row{name: "at rest", unit: "ms/s", values: [3]float64{0, 0, 0.5}, proxiesOnly: true}
	if got := r.proxyValue(1); got != "0" {
		t.Errorf("bare proxy at rest printed %q, want 0", got)
	}
	if got := (row{values: [3]float64{0, 0, 1}}).proxyValue(1); got != "—" {
		t.Errorf("an unmeasured figure printed %q, want —", got)
	}
}
