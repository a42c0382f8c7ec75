//go:build load

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/test/apiserver"
)

// swarmAccounts is how many service accounts the swarming tenant mints.
const swarmAccounts = 12

// TestLoadHostileSwarm is part of `make load-hostile`, not of `make test`
// (build tag load): watchgate replicas with default flags and the chart's
// default budgets (--bootstrap-budgets) in front of a dedicated control
// plane with its watch cache, loopback only.
//
//  1. An agent restarts: one caller reopens SWARM_REOPEN (10,000) watches
//     at once from 100 connections, through a replica charted for it (2Gi,
//     GOMEMLIMIT 90% of it: a caller's ceiling of 17,000 watches; at 512Mi
//     it is 3,899, and an agent holding more must raise
//     --max-watches-per-identity); every one must be open within 90 s,
//     none refused.
//  2. Through a replica charted at 512Mi (GOMEMLIMIT 460 MiB), a tenant
//     mints 12 service accounts in its namespace and each opens watches as
//     fast as it can (8 at a time, up to 1,200 each, held) for up to
//     HOSTILE_ATTACK, while a routed agent (70 informers, client-go QPS 20
//     / burst 30) restarts every 10 s. The namespace's accounts together
//     must hold at most one caller's ceiling (a quarter of --max-watches),
//     the agent gets no 429 and syncs within twice its quiet time (or 1 s,
//     whichever is more: the swarm runs in this process, on the same two
//     CPUs as the API server and the replica).
//
// The figures (reopen time, sync times, the swarm's watches, refusals by
// reason, peak RSS) are logged, not written.
func TestLoadHostileSwarm(t *testing.T) {
	attackFor := envDuration("HOSTILE_ATTACK", 60*time.Second)
	reopen := 10000
	if v := os.Getenv("SWARM_REOPEN"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("SWARM_REOPEN=%s: %v", v, err)
		}
		reopen = n
	}
	root := apiserver.RepoRoot()
	bin := filepath.Join(root, "bin", "watchgate")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s missing: run `make build` (make load-hostile does)", bin)
	}
	e, err := apiserver.Start(apiserver.Options{
		CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")},
		Args:              map[string]string{"http2-max-streams-per-connection": "2000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ctx := context.Background()
	victimNS, reopenNS, swarmNS := uniqueName("victim"), uniqueName("reopen"), uniqueName("swarm")
	account := func(ns, name string) string {
		sa, err := e.ServiceAccount(ctx, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Grant(ctx, sa, readWatch("configmaps", "secrets")); err != nil {
			t.Fatal(err)
		}
		return sa.Token
	}
	victim := account(victimNS, "agent")
	for i := range victimInformers {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("item-%d", i), Labels: map[string]string{"informer": strconv.Itoa(i)}}}
		if _, err := e.Clientset.CoreV1().Secrets(victimNS).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	reopener := account(reopenNS, "agent")
	var swarm []string
	for i := range swarmAccounts {
		swarm = append(swarm, account(swarmNS, fmt.Sprintf("sa-%d", i)))
	}

	client := func() *http.Client {
		return &http.Client{Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // loopback, a throwaway certificate
			ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64,
		}}
	}

	// 1. The agent's mass reopen.
	big := startWatchgate(t, e, bin, []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", (2<<30)*9/10>>20)}, chartBudgets(t, root))
	var opened atomic.Int64
	var mu sync.Mutex
	reopenRefused := map[string]int{}
	var held []heldWatch
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 100 {
		c := client()
		wg.Go(func() {
			for next.Add(1) <= int64(reopen) && time.Since(start) < 90*time.Second {
				w := hold(t, c, big.url, reopener, longWatch(reopenNS))
				mu.Lock()
				if w.code == http.StatusOK {
					opened.Add(1)
					held = append(held, w)
				} else {
					reopenRefused[fmt.Sprintf("%d %s", w.code, w.decision)]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	reopenTook := time.Since(start)
	t.Logf("agent's reopen: %d of %d watches open in %v; refused %v", opened.Load(), reopen, reopenTook.Round(time.Millisecond), reopenRefused)
	if opened.Load() != int64(reopen) {
		t.Errorf("the agent reopened %d of %d watches within 90 s, want all", opened.Load(), reopen)
	}
	for _, w := range held {
		w.close()
	}
	big.stop()
	const limit = 512 << 20
	p := startWatchgate(t, e, bin, []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", limit*9/10>>20)}, chartBudgets(t, root))
	peakRSS := p.peakRSS(250 * time.Millisecond)
	defer peakRSS()

	// 2. The swarm, and the victim's restarts.
	cfg := &rest.Config{Host: p.url, BearerToken: victim, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 20, Burst: 30}
	var victim429 atomic.Int64
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return &count429{next: rt, n: &victim429} }
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	agent := &victimAgent{cs: cs, ns: victimNS}
	var quiet time.Duration
	for i := range 4 {
		d, err := agent.start()
		if err != nil {
			t.Fatalf("quiet start: %v", err)
		}
		agent.stop()
		if i > 0 {
			quiet = max(quiet, d)
		}
		time.Sleep(500 * time.Millisecond)
	}
	before, err := scrape(p.statsURL)
	if err != nil {
		t.Fatal(err)
	}
	attackCtx, stopAttack := context.WithTimeout(ctx, attackFor)
	defer stopAttack()
	var swarmHeld atomic.Int64
	swarmAnswers := map[string]int{}
	var attack sync.WaitGroup
	for _, token := range swarm {
		c := client()
		for range 8 {
			attack.Go(func() {
				for range 150 {
					if attackCtx.Err() != nil {
						return
					}
					w := hold(t, c, p.url, token, longWatch(swarmNS))
					if w.code == http.StatusOK {
						swarmHeld.Add(1)
					}
					mu.Lock()
					swarmAnswers[strconv.Itoa(w.code)]++
					mu.Unlock()
				}
			})
		}
	}
	var syncs []time.Duration
	for restartAt := time.Now().Add(5 * time.Second); time.Until(restartAt) < attackFor-5*time.Second && attackCtx.Err() == nil; restartAt = restartAt.Add(10 * time.Second) {
		time.Sleep(time.Until(restartAt))
		d, err := agent.start()
		agent.stop()
		if err != nil {
			t.Errorf("restart during the swarm: %v", err)
			break
		}
		syncs = append(syncs, d)
		t.Logf("restart %d during the swarm: synced in %v (quiet %v); the swarm holds %d", len(syncs), d, quiet, swarmHeld.Load())
	}
	attack.Wait()
	after, err := scrape(p.statsURL)
	if err != nil {
		t.Fatal(err)
	}
	peak := peakRSS()

	goMemLimit := uint64(limit * 9 / 10 >> 20 << 20)
	ceiling := int64(proxy.MaxWatchesFor(proxy.MemoryLimit{Source: proxy.MemoryLimitFromGoMemLimit, Bytes: goMemLimit, GoMemLimit: goMemLimit}) / 4)
	if n := swarmHeld.Load(); n > ceiling {
		t.Errorf("the namespace's %d service accounts hold %d watches, want at most one caller's ceiling, %d", swarmAccounts, n, ceiling)
	}
	if n := victim429.Load(); n != 0 {
		t.Errorf("the victim got %d × 429", n)
	}
	for i, d := range syncs {
		if d > max(2*quiet, time.Second) {
			t.Errorf("restart %d during the swarm synced in %v, over twice the quiet %v and 1 s", i+1, d, quiet)
		}
	}
	if peak >= limit {
		t.Errorf("peak RSS %d MiB reached the chart's limit %d MiB", peak>>20, limit>>20)
	}
	refusals := apiserver.SumBy(after, "watchgate_proxy_guard_rejections_total", "reason", nil)
	refusalsBefore := apiserver.SumBy(before, "watchgate_proxy_guard_rejections_total", "reason", nil)
	var parts []string
	for _, k := range sortedKeys(refusals) {
		if v := refusals[k] - refusalsBefore[k]; v > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, v))
		}
	}
	t.Logf("figures: agent's reopen (2Gi replica) %d watches in %v; victim quiet %v, during the swarm %s; swarm of %d accounts holds %d (ceiling %d), answers %v; guard refusals during the swarm: %s; victim 429s %d; peak RSS %d MiB (limit 512 MiB, GOMEMLIMIT 460 MiB); %s",
		opened.Load(), reopenTook.Round(time.Millisecond), quiet.Round(time.Millisecond), durations(syncs), swarmAccounts, swarmHeld.Load(), ceiling,
		swarmAnswers, strings.Join(parts, ", "), victim429.Load(), peak>>20, machine())
}

// chartBudgets is the --bootstrap-budgets flag the chart (and
// config/manager/manager.yaml, the same pod) gives a replica: the default
// budgets its leader keeps.
func chartBudgets(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "config", "manager", "manager.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--bootstrap-budgets=") {
				return a
			}
		}
	}
	t.Fatal("config/manager/manager.yaml has no --bootstrap-budgets")
	return ""
}
