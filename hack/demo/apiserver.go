package main

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/watchgate/watchgate/test/apiserver"
)

// apiServerCPU reads the API server's CPU time: from its own /metrics
// (process_cpu_seconds_total, the standard process collector) when it
// exposes it, else from /proc/<pid>/stat of the kube-apiserver process
// serving env's port.
type apiServerCPU struct {
	env *apiserver.Env
}

func newAPIServerCPU(env *apiserver.Env) apiServerCPU { return apiServerCPU{env: env} }

func (c apiServerCPU) seconds(ctx context.Context) (float64, error) {
	fams, err := c.env.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	if _, ok := fams["process_cpu_seconds_total"]; ok {
		return apiserver.Sum(fams, "process_cpu_seconds_total", nil), nil
	}
	pid, err := c.pid()
	if err != nil {
		return 0, err
	}
	d, err := processCPU(pid)
	return d.Seconds(), err
}

// pid finds the kube-apiserver whose command line names env's secure port.
func (c apiServerCPU) pid() (int, error) {
	u, err := url.Parse(c.env.Config.Host)
	if err != nil {
		return 0, err
	}
	want := []byte("--secure-port=" + u.Port())
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(b, []byte("kube-apiserver")) {
			continue
		}
		for _, arg := range bytes.Split(b, []byte{0}) {
			if bytes.Equal(arg, want) {
				return strconv.Atoi(filepath.Base(filepath.Dir(f)))
			}
		}
	}
	return 0, fmt.Errorf("no kube-apiserver process with %s", want)
}

// processCPU is user + system CPU of pid (all threads) from
// /proc/<pid>/stat, in USER_HZ = 100 ticks.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(u+st) * 10 * time.Millisecond, nil
}

// sampleWatchRequests reads apiserver_request_total{verb="WATCH",
// resource="configmaps"} every interval until ctx ends. A failed read
// skips that sample; alignedRates turns the samples into the chart's rate.
func sampleWatchRequests(ctx context.Context, env *apiserver.Env, interval time.Duration) []counterSample {
	start := time.Now()
	var samples []counterSample
	// read records the counter as of the middle of the request, since a
	// scrape of /metrics takes a while on a busy machine.
	read := func() {
		t0 := time.Now()
		v, err := env.WatchRequests(ctx, "", "configmaps")
		if err == nil {
			samples = append(samples, counterSample{at: t0.Add(time.Since(t0) / 2).Sub(start), value: v})
		}
	}
	read()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return samples
		case <-t.C:
		}
		read()
	}
}
