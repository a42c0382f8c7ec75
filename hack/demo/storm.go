package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"

	"github.com/watchgate/watchgate/test/apiserver"
)

// stormResult is what one storm did, counted by the clients, the
// well-behaved client and the API server itself.
type stormResult struct {
	attempts int64
	answers  map[string]int64
	// upstream is the number of WATCH requests on configmaps the API
	// server counted during the storm, less the well-behaved client's own
	// (its informer's watch).
	upstream float64
	// apiCPU is the API server's CPU time during the storm, in seconds.
	apiCPU float64
	// proxyCPU is watchgate's own CPU time during the storm, in seconds;
	// 0 without watchgate.
	proxyCPU float64
	// wellBehaved is the well-behaved client's experience.
	wellBehaved wellBehavedResult
	// rate is upstream WATCH/s over each second of the storm.
	rate []ratePoint
}

func (r stormResult) print() {
	if r.attempts > 0 {
		fmt.Printf("    %d resubscriptions; answers:", r.attempts)
		for k, v := range r.answers {
			fmt.Printf(" %s×%d", k, v)
		}
	}
	if r.attempts > 0 {
		fmt.Println()
	}
	fmt.Printf("    the API server counted %s on configmaps (apiserver_request_total) and used %.1f CPU seconds\n",
		count(r.upstream, "WATCH request", "WATCH requests"), r.apiCPU)
	if r.proxyCPU > 0 {
		fmt.Printf("    watchgate used %.2f CPU seconds\n", r.proxyCPU)
	}
	fmt.Printf("    the well-behaved client: GET p50 %s, p99 %s over %d GETs (%d failed); informer synced in %s\n",
		ms(r.wellBehaved.p50), ms(r.wellBehaved.p99), r.wellBehaved.gets, r.wellBehaved.failed, r.wellBehaved.synced.Round(time.Millisecond))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// runStorm runs clients that do what the seed's dashboard did — watch from
// rv, read until the stream ends, re-subscribe at once with the same rv,
// 100 clients to a connection (stormClients) —
// while a well-behaved client (good) does its work through the same path
// and a sampler records the API server's upstream WATCH rate. With 0
// clients it measures the quiet baseline: the well-behaved client alone.
// proxyPID, when not 0, is watchgate's process, whose CPU time is counted.
func runStorm(ctx context.Context, env *apiserver.Env, storm, good *rest.Config, path, rv string, clients int, d time.Duration, proxyPID int) (stormResult, error) {
	var stormers []stormClient
	if clients > 0 {
		var err error
		if stormers, err = stormClients(storm, clients); err != nil {
			return stormResult{}, err
		}
		defer closeStormClients(stormers)
		if err := connect(ctx, stormers); err != nil {
			return stormResult{}, err
		}
	}
	before, err := env.WatchRequests(ctx, "", "configmaps")
	if err != nil {
		return stormResult{}, err
	}
	cpu := newAPIServerCPU(env)
	cpuBefore, err := cpu.seconds(ctx)
	if err != nil {
		return stormResult{}, err
	}
	var proxyBefore time.Duration
	if proxyPID != 0 {
		if proxyBefore, err = processCPU(proxyPID); err != nil {
			return stormResult{}, err
		}
	}
	var attempts atomic.Int64
	var mu sync.Mutex
	answers := map[string]int64{}
	stormCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var sampled []counterSample
	var wbRes wellBehavedResult
	var wbErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); sampled = sampleWatchRequests(stormCtx, env, 250*time.Millisecond) }()
	go func() { defer wg.Done(); wbRes, wbErr = runWellBehaved(stormCtx, good, "demo") }()
	for _, c := range stormers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for stormCtx.Err() == nil {
				a, err := c.watch(stormCtx, path, rv, 5*time.Second)
				if stormCtx.Err() != nil {
					return
				}
				attempts.Add(1)
				var key string
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					key = "no-answer-in-5s"
				case err != nil:
					key = "error(" + errorTail(err) + ")"
				case a.httpStatus == http.StatusOK && a.code == http.StatusGone:
					key = "200+410"
				default:
					key = fmt.Sprint(a.httpStatus)
				}
				mu.Lock()
				answers[key]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if wbErr != nil {
		return stormResult{}, fmt.Errorf("well-behaved client: %w", wbErr)
	}
	time.Sleep(500 * time.Millisecond) // let the API server count the last ones
	after, err := env.WatchRequests(ctx, "", "configmaps")
	if err != nil {
		return stormResult{}, err
	}
	cpuAfter, err := cpu.seconds(ctx)
	if err != nil {
		return stormResult{}, err
	}
	r := stormResult{attempts: attempts.Load(), answers: answers, upstream: after - before - float64(wbRes.watches),
		apiCPU: cpuAfter - cpuBefore, wellBehaved: wbRes, rate: alignedRates(sampled, time.Second)}
	if proxyPID != 0 {
		proxyAfter, err := processCPU(proxyPID)
		if err != nil {
			return stormResult{}, err
		}
		r.proxyCPU = (proxyAfter - proxyBefore).Seconds()
	}
	return r, nil
}

// errorTail is the last part of err's message (after its last ": "), at
// most 40 bytes, so that errors of one kind count under one answer.
func errorTail(err error) string {
	m := err.Error()
	if i := strings.LastIndex(m, ": "); i >= 0 {
		m = m[i+2:]
	}
	return m[:min(len(m), 40)]
}
