//go:build load

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"

	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/test/apiserver"
)

// TestLoadHostileSlowReaders is part of `make load-hostile` (build tag
// load): one replica as the chart runs it (default flags, GOMEMLIMIT 90% of
// the 512Mi limit; no WatchBudget, so only the replica's guard decides)
// in front of its own control plane, loopback only. A
// tenant with an ordinary service account that may read ConfigMaps in its
// own namespace, where one ConfigMap holds 900 KiB, opens
// HOSTILE_UNREAD_WATCHES (260) watches of it and then HOSTILE_UNREAD_LISTS
// (420) lists of the namespace, each on an HTTP/2 connection of its own
// that never gives flow-control credit back: a client that does not read.
// Meanwhile another tenant opens a watch and a list every 250 ms.
//
// It asserts that the other tenant is never refused, that the replica's
// RSS stays under the chart's limit, and that every unread stream is
// either refused or cut within --stalled-stream-timeout (30 s) and a
// sweep; it reports peak RSS, the guard's refusals by reason, the
// streams cut and what each side got.
func TestLoadHostileSlowReaders(t *testing.T) {
	unreadWatches := envInt("HOSTILE_UNREAD_WATCHES", 260)
	unreadLists := envInt("HOSTILE_UNREAD_LISTS", 420)
	root := apiserver.RepoRoot()
	bin := filepath.Join(root, "bin", "watchgate")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s missing: run `make build` (make load-hostile does)", bin)
	}
	load0 := loadAvg()
	started := time.Now().UTC()
	e, err := apiserver.Start(apiserver.Options{
		CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")},
		Args:              map[string]string{"http2-max-streams-per-connection": "2000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ctx := context.Background()

	tenantNS, otherNS := uniqueName("slow-tenant"), uniqueName("other-tenant")
	tenant, err := e.ServiceAccount(ctx, tenantNS, "tenant")
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.ServiceAccount(ctx, otherNS, "other")
	if err != nil {
		t.Fatal(err)
	}
	for _, sa := range []apiserver.ServiceAccount{tenant, other} {
		if err := e.Grant(ctx, sa, readWatch("configmaps")); err != nil {
			t.Fatal(err)
		}
	}
	big := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "large"}, Data: map[string]string{"blob": strings.Repeat("x", largeConfigMapBytes)}}
	if _, err := e.Clientset.CoreV1().ConfigMaps(tenantNS).Create(ctx, big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("localhost", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const limit = 512 << 20
	goMemLimit := limit * 9 / 10
	p := startWatchgate(t, e, bin, []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", goMemLimit>>20)},
		"--tls-cert-file="+filepath.Join(dir, "tls.crt"), "--tls-private-key-file="+filepath.Join(dir, "tls.key"))
	peakRSS := p.peakRSS(250 * time.Millisecond)
	defer peakRSS()
	px := &testProxy{URL: p.url, CA: certPEM}
	before, err := scrape(p.statsURL)
	if err != nil {
		t.Fatal(err)
	}

	// The other tenant, every 250 ms until the end: a watch (its head
	// only) and a list.
	hc, err := rest.HTTPClientFor(&rest.Config{Host: p.url, BearerToken: other.Token, TLSClientConfig: rest.TLSClientConfig{CAData: certPEM, ServerName: "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	probe := func(path string) string {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, p.url+path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			return "error"
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK && !strings.Contains(path, "watch=true") {
			_, _ = io.Copy(io.Discard, resp.Body)
		}
		if resp.StatusCode == http.StatusOK {
			return "200"
		}
		return fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get(proxy.DecisionHeader))
	}
	var mu sync.Mutex
	otherAnswers := map[string]int{}
	stopProbes := make(chan struct{})
	var probes sync.WaitGroup
	probes.Go(func() {
		for {
			for _, path := range []string{"/api/v1/namespaces/" + otherNS + "/configmaps?watch=true", "/api/v1/namespaces/" + otherNS + "/configmaps"} {
				a := probe(path)
				mu.Lock()
				otherAnswers[a]++
				mu.Unlock()
			}
			select {
			case <-stopProbes:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	})

	// The tenant's unread watches, then its unread lists.
	var streams []*unreadStream
	kinds := map[*unreadStream]string{}
	defer func() {
		for _, u := range streams {
			_ = u.conn.Close()
		}
	}()
	attackStart := time.Now()
	for i := range unreadWatches + unreadLists {
		kind, path := "watch", "/api/v1/namespaces/"+tenantNS+"/configmaps?watch=true"
		if i >= unreadWatches {
			kind, path = "list", "/api/v1/namespaces/"+tenantNS+"/configmaps"
		}
		u := openUnreadStream(t, px, tenant.Token, path)
		streams = append(streams, u)
		kinds[u] = kind
	}
	opened := time.Since(attackStart)
	// Past --stalled-stream-timeout and a sweep.
	time.Sleep(proxy.DefaultStalledStreamTimeout + 5*time.Second - opened)

	type outcome struct{ kind, what string }
	outcomes := map[outcome]int{}
	var ends sync.WaitGroup
	for _, u := range streams {
		ends.Go(func() {
			refused, err := u.end(15 * time.Second)
			what := "cut"
			switch {
			case err != nil:
				what = "not cut: " + err.Error()
				if i := strings.Index(what, " ("); i > 0 {
					what = what[:i]
				}
			case refused != "":
				what = "refused " + refused
			}
			mu.Lock()
			outcomes[outcome{kinds[u], what}]++
			mu.Unlock()
		})
	}
	ends.Wait()
	close(stopProbes)
	probes.Wait()
	after, err := scrape(p.statsURL)
	if err != nil {
		t.Fatal(err)
	}
	peak := peakRSS()

	for o, n := range outcomes {
		if strings.HasPrefix(o.what, "not cut") {
			t.Errorf("%d unread %ss: %s", n, o.kind, o.what)
		}
	}
	for a, n := range otherAnswers {
		if a != "200" {
			t.Errorf("the other tenant got %d × %s", n, a)
		}
	}
	if peak >= limit {
		t.Errorf("peak RSS %d MiB reached the chart's limit %d MiB", peak>>20, limit>>20)
	}

	delta := func(family, label string) string {
		a, b := apiserver.SumBy(after, family, label, nil), apiserver.SumBy(before, family, label, nil)
		var parts []string
		for _, k := range sortedKeys(a) {
			if v := a[k] - b[k]; v > 0 {
				parts = append(parts, fmt.Sprintf("%s %.0f", k, v))
			}
		}
		if len(parts) == 0 {
			return "none"
		}
		return strings.Join(parts, ", ")
	}
	var tenantParts []string
	for _, kind := range []string{"watch", "list"} {
		for o, n := range outcomes {
			if o.kind == kind {
				tenantParts = append(tenantParts, fmt.Sprintf("%ss %s: %d", kind, o.what, n))
			}
		}
	}
	var rows [][2]string
	row := func(k, v string) { rows = append(rows, [2]string{k, v}); t.Logf("%s: %s", k, v) }
	row("tenant: unread watches, unread lists of its 900 KiB ConfigMap", fmt.Sprintf("%d, %d (opened in %v)", unreadWatches, unreadLists, opened.Round(time.Millisecond)))
	row("replica: peak RSS (limit 512 MiB, GOMEMLIMIT 460 MiB)", fmt.Sprintf("%d MiB", peak>>20))
	row("guard refusals by reason (watchgate_proxy_guard_rejections_total)", delta("watchgate_proxy_guard_rejections_total", "reason"))
	row("streams cut by kind (watchgate_proxy_stalled_streams_cut_total)", delta("watchgate_proxy_stalled_streams_cut_total", "kind"))
	row("tenant: how its unread streams ended", strings.Join(tenantParts, "; "))
	row("other tenant: answers to a watch and a list every 250 ms", answersString(otherAnswers))

	commit, _ := exec.Command("git", "-C", root, "describe", "--always", "--dirty").Output()
	var b strings.Builder
	fmt.Fprintf(&b, "Command: `make load-hostile` (TestLoadHostileSlowReaders); %s; commit %s; load average %s at the start, %s at the end; %s.\n\n",
		started.Format("2006-01-02 15:04 UTC"), strings.TrimSpace(string(commit)), load0, loadAvg(), machine())
	b.WriteString("| figure | value |\n|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s |\n", r[0], r[1])
	}
	fmt.Println(b.String())
}
