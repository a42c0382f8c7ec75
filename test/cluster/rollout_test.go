package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/test/apiserver"
)

// rolloutWatches is how many watches stay open through the rollout.
const rolloutWatches = 200

// watchTally is what the watchers saw, updated by every watcher.
type watchTally struct {
	opened, cleanEnds, cutEnds, reconnects, serverErrors atomic.Int64
	mu                                                   sync.Mutex
	errs                                                 []string
}

func (w *watchTally) note(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.errs) < 10 {
		w.errs = append(w.errs, fmt.Sprintf(format, args...))
	}
}

// TestHelmUpgradeRollsUnder200Watches keeps 200 watches open through the
// proxy Service while `helm upgrade` rolls the Deployment: every watch the
// old replicas held ends with a complete response (the drain, not a cut
// connection), its client reconnects to a ready replica, no request gets
// a 5xx, and a replica is available throughout (maxUnavailable 0), the
// PodDisruptionBudget's healthy pods never below what it requires.
func TestHelmUpgradeRollsUnder200Watches(t *testing.T) {
	ensureRelease(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cs := cl.Clientset
	ns := labelledNamespace(t, ctx)
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "watcher"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grant(t, ctx, ns, "watcher", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}})
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "watcher", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services(releaseNS).Get(ctx, proxyService, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secret, err := cs.CoreV1().Secrets(releaseNS).Get(ctx, "watchgate-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(secret.Data["ca.crt"])
	// HTTP/1.1, one connection per watch, through kube-proxy's rules for
	// the Service's cluster IP, as a pod's client-go reaches it.
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: proxyService + "." + releaseNS + ".svc"},
		TLSNextProto:    map[string]func(string, *tls.Conn) http.RoundTripper{},
		MaxConnsPerHost: 0, MaxIdleConnsPerHost: rolloutWatches,
	}}
	url := "https://" + net.JoinHostPort(svc.Spec.ClusterIP, "443") + "/api/v1/namespaces/" + ns + "/configmaps?watch=1&allowWatchBookmarks=true&timeoutSeconds=600"

	var tally watchTally
	stop := make(chan struct{})
	var wg sync.WaitGroup
	firstOpen := make(chan struct{}, rolloutWatches)
	stopWatchers := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopWatchers()
	for i := range rolloutWatches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			watchLoop(ctx, client, url, tr.Status.Token, &tally, stop, firstOpen, i)
		}()
	}
	for range rolloutWatches {
		select {
		case <-firstOpen:
		case <-ctx.Done():
			t.Fatalf("only %d of %d watches opened", tally.opened.Load(), rolloutWatches)
		}
	}

	// A replica stays available throughout.
	var minAvailable atomic.Int32
	minAvailable.Store(99)
	var pdbSeen, pdbBroken atomic.Bool
	sampling, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		_ = wait.PollUntilContextCancel(sampling, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			if d, err := cs.AppsV1().Deployments(releaseNS).Get(ctx, deployment, metav1.GetOptions{}); err == nil && d.Status.AvailableReplicas < minAvailable.Load() {
				minAvailable.Store(d.Status.AvailableReplicas)
			}
			if pdb, err := cs.PolicyV1().PodDisruptionBudgets(releaseNS).Get(ctx, deployment, metav1.GetOptions{}); err == nil {
				pdbSeen.Store(true)
				if pdb.Status.CurrentHealthy < pdb.Status.DesiredHealthy {
					pdbBroken.Store(true)
				}
			}
			return false, nil
		})
	}()
	start := time.Now()
	release.mu.Lock()
	_, err = apiserver.Helm(ctx, helm, cl.Kubeconfig, "upgrade", releaseName, chartPath(), "-n", releaseNS, "--reuse-values",
		"--set-string", "podAnnotations.watchgate\\.io/rolled="+fmt.Sprint(time.Now().Unix()), "--wait", "--timeout", "5m")
	release.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade --wait rolled both replicas in %.1fs", time.Since(start).Seconds())
	// Every watch has moved: the old replicas are gone.
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		return tally.reconnects.Load() >= rolloutWatches, nil
	}); err != nil {
		t.Errorf("%d reconnects after the rollout, want every one of the %d watches to reconnect", tally.reconnects.Load(), rolloutWatches)
	}
	stopSampling()
	<-sampled
	stopWatchers()
	t.Logf("watches: %d opened, %d ended complete, %d cut, %d reconnected; 5xx: %d; fewest available replicas: %d",
		tally.opened.Load(), tally.cleanEnds.Load(), tally.cutEnds.Load(), tally.reconnects.Load(), tally.serverErrors.Load(), minAvailable.Load())
	if n := tally.cutEnds.Load(); n > 0 {
		t.Errorf("%d watches were cut (the connection ended mid-response) instead of ended: %q", n, tally.errs)
	}
	if n := tally.serverErrors.Load(); n > 0 {
		t.Errorf("%d requests got a 5xx: %q", n, tally.errs)
	}
	if tally.cleanEnds.Load() < rolloutWatches {
		t.Errorf("%d watches ended complete, want at least the %d the old replicas held", tally.cleanEnds.Load(), rolloutWatches)
	}
	if !pdbSeen.Load() {
		t.Errorf("no PodDisruptionBudget %s/%s: the chart renders one with 2 replicas", releaseNS, deployment)
	}
	if pdbBroken.Load() {
		t.Errorf("the PodDisruptionBudget had fewer healthy pods than it requires during the rollout")
	}
	if minAvailable.Load() < 1 {
		t.Errorf("the Deployment had %d available replicas during the rollout", minAvailable.Load())
	}
}

// watchLoop opens a watch, reads it to its end and opens another, until
// stop; it tells firstOpen when its first watch is open.
func watchLoop(ctx context.Context, client *http.Client, url, token string, tally *watchTally, stop <-chan struct{}, firstOpen chan<- struct{}, i int) {
	first := true
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			// Refused or reset while kube-proxy still names a stopping
			// replica: not an answer, retry.
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode >= 500 {
				tally.serverErrors.Add(1)
				tally.note("watch %d: %s: %s", i, resp.Status, b)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		tally.opened.Add(1)
		if first {
			first = false
			firstOpen <- struct{}{}
		} else {
			tally.reconnects.Add(1)
		}
		done := make(chan struct{})
		go func() {
			select {
			case <-stop:
				resp.Body.Close()
			case <-done:
			}
		}()
		dec := json.NewDecoder(resp.Body)
		var err2 error
		for {
			var ev map[string]any
			if err2 = dec.Decode(&ev); err2 != nil {
				break
			}
		}
		close(done)
		resp.Body.Close()
		select {
		case <-stop:
			return
		default:
		}
		if errors.Is(err2, io.EOF) {
			tally.cleanEnds.Add(1)
		} else {
			tally.cutEnds.Add(1)
			tally.note("watch %d: %v", i, err2)
		}
	}
}
