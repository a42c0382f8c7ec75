package main

import (
	"context"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// wellBehavedResult is what a client that does nothing wrong saw during a
// storm: the latency of its periodic GETs and how long its informer took to
// sync.
type wellBehavedResult struct {
	gets, failed int
	// watches is how many watch requests the informer sent (a relist
	// opens another), so that the storm's figures can leave them out.
	watches  int
	p50, p99 time.Duration
	synced   time.Duration
}

// getInterval is how often the well-behaved client GETs a config map.
const getInterval = 50 * time.Millisecond

// runWellBehaved runs a client-go informer on the config maps of ns plus a
// GET of one of them every getInterval, through cfg, until ctx ends.
func runWellBehaved(ctx context.Context, cfg *rest.Config, ns string) (wellBehavedResult, error) {
	var watches atomic.Int64
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Query().Get("watch") == "true" {
				watches.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return wellBehavedResult{}, err
	}
	cms, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return wellBehavedResult{}, err
	}
	name := "first"
	if len(cms.Items) > 0 {
		name = cms.Items[0].Name
	}
	var res wellBehavedResult
	start := time.Now()
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().ConfigMaps().Informer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	var synced atomic.Int64 // nanoseconds; 0 until synced
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			synced.Store(int64(time.Since(start)))
		}
	}()
	var lat []time.Duration
	t := time.NewTicker(getInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			factory.Shutdown() // its watch is counted before the storm's total is read
			res.synced = time.Duration(synced.Load())
			res.watches = int(watches.Load())
			slices.Sort(lat)
			res.gets = len(lat) + res.failed
			if len(lat) > 0 {
				res.p50 = lat[len(lat)/2]
				res.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
			}
			return res, nil
		case <-t.C:
		}
		t0 := time.Now()
		_, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if ctx.Err() != nil {
			continue
		}
		if err != nil {
			res.failed++
			continue
		}
		lat = append(lat, time.Since(t0))
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
