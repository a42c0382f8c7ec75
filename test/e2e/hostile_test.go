//go:build load

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/time/rate"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/inject"
	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/test/apiserver"
)

// victimInformers is how many informers the routed agent runs.
const victimInformers = 70

// TestLoadHostileTenant is `make load-hostile`, not part of `make test`
// (build tag load): one watchgate replica as the chart runs it (default
// flags, GOMEMLIMIT 90% of the 512Mi limit, the chart's default budgets,
// injection on)
// in front of a dedicated control plane, loopback only.
//
// A routed agent (its own service account, 70 label-selected ConfigMap
// informers, client-go's QPS 20 / burst 30 as controller-runtime sets them)
// measures its sync time (start → every informer synced) on a quiet
// replica, then restarts every 15 s while, for 60 s, one service account
// allowed to impersonate users and groups attacks the replica at once
// with: watches in its own name beyond its per-identity ceiling; watches
// as thousands of made-up impersonated users; a storm of concurrent
// watches from one stale resourceVersion and random bearer tokens from
// eight addresses of one /24, each spread evenly over the attack; its own
// token bound to a pod that was deleted; AdmissionReviews of 2.9 MiB and
// 6 MiB at the webhook port. Every loop is bounded in count and ends with
// the attack. At each restart the same agent also starts straight against
// kube-apiserver, as a control of what the shared machine alone costs a
// sync.
//
// It asserts that each restart syncs within twice the quiet time without
// one 429, and that the replica's RSS stays under the chart's limit; it
// prints a table and, with LOAD_WRITE=path, replaces the part of that file
// between <!-- hostile:begin --> and <!-- hostile:end -->.
func TestLoadHostileTenant(t *testing.T) {
	attackFor := envDuration("HOSTILE_ATTACK", 60*time.Second)
	root := apiserver.RepoRoot()
	bin := filepath.Join(root, "bin", "watchgate")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s missing: run `make build` (make load-hostile does)", bin)
	}
	load0 := loadAvg()
	started := time.Now().UTC()

	e, err := apiserver.Start(apiserver.Options{
		// Versions go stale within seconds, for the stale storm.
		StaleVersions:     true,
		CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")},
		Args:              map[string]string{"http2-max-streams-per-connection": "2000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ctx := context.Background()
	budgets, err := os.ReadFile(filepath.Join(root, "config", "default", "budgets", "budgets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubectlApply(ctx, e, string(budgets)); err != nil {
		t.Fatal(err)
	}

	// The victim: its own service account and one ConfigMap per informer.
	victimNS := uniqueName("victim")
	victim, err := e.ServiceAccount(ctx, victimNS, "agent")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Grant(ctx, victim, readWatch("configmaps")); err != nil {
		t.Fatal(err)
	}
	for i := range victimInformers {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("item-%d", i), Labels: map[string]string{"informer": strconv.Itoa(i)}}}
		if _, err := e.Clientset.CoreV1().ConfigMaps(victimNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The attacker: one service account that may read ConfigMaps and
	// impersonate users and groups; every user may watch ConfigMaps in its
	// namespace, so that its made-up users' watches are served and held.
	attackNS := uniqueName("attacker")
	attacker, err := e.ServiceAccount(ctx, attackNS, "tenant")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Grant(ctx, attacker, readWatch("configmaps"),
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}}); err != nil {
		t.Fatal(err)
	}
	readers := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "hostile-readers-" + attackNS}, Rules: []rbacv1.PolicyRule{readWatch("configmaps")}}
	if _, err := e.Clientset.RbacV1().ClusterRoles().Create(ctx, readers, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Clientset.RbacV1().RoleBindings(attackNS).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "everyone-reads"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: readers.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Its token bound to a pod, then the pod deleted.
	pod, err := e.Clientset.CoreV1().Pods(attackNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-0"},
		Spec:       corev1.PodSpec{ServiceAccountName: attacker.Name, Containers: []corev1.Container{{Name: "tenant", Image: "tenant"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := e.Clientset.CoreV1().ServiceAccounts(attackNS).CreateToken(ctx, attacker.Name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deletedPodToken := tr.Status.Token
	if err := e.Clientset.CoreV1().Pods(attackNS).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	stale, err := e.StaleVersion(ctx, attackNS, 20, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	// The replica, as the chart starts it with injection on: a serving
	// certificate in a Secret's layout and the webhook's port.
	dir := t.TempDir()
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("localhost", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": certPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	webhookAddr, err := apiserver.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, webhookPort, _ := net.SplitHostPort(webhookAddr)
	const limit = 512 << 20
	goMemLimit := limit * 9 / 10
	p := startWatchgate(t, e, bin, []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", goMemLimit>>20)},
		"--tls-cert-file="+filepath.Join(dir, "tls.crt"), "--tls-private-key-file="+filepath.Join(dir, "tls.key"),
		"--webhook-port="+webhookPort, "--pod-namespace=watchgate-system")
	var peak atomic.Uint64
	stopSampling := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		for {
			if r := p.sample().rss; r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
	defer func() { close(stopSampling); sampling.Wait() }()

	cfg := &rest.Config{
		Host:            p.url,
		BearerToken:     victim.Token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, // loopback, a throwaway certificate
		QPS:             20,
		Burst:           30,
	}
	var victim429 atomic.Int64
	var agentTrace, controlTrace requestTrace
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return agentTrace.wrap(&count429{next: rt, n: &victim429})
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	agent := &victimAgent{cs: cs, ns: victimNS}
	// The same agent straight to kube-apiserver: what the machine alone
	// costs a sync while the attack runs.
	direct := rest.CopyConfig(e.ConfigFor(victim.Token, "", nil))
	direct.QPS, direct.Burst = cfg.QPS, cfg.Burst
	direct.WrapTransport = controlTrace.wrap
	dcs, err := kubernetes.NewForConfig(direct)
	if err != nil {
		t.Fatal(err)
	}
	control := &victimAgent{cs: dcs, ns: victimNS}

	// Quiet: three starts; the slowest is the quiet time.
	var quiet time.Duration
	for range 3 {
		d, err := agent.start()
		if err != nil {
			t.Fatalf("quiet start: %v", err)
		}
		quiet = max(quiet, d)
		agent.stop()
	}
	t.Logf("quiet sync (slowest of 3): %v", quiet)
	var directQuiet time.Duration
	for range 3 {
		d, err := control.start()
		if err != nil {
			t.Fatalf("quiet start, straight to the API server: %v", err)
		}
		directQuiet = max(directQuiet, d)
		control.stop()
	}
	if _, err := agent.start(); err != nil {
		t.Fatalf("start before the attack: %v", err)
	}
	before, err := scrape(p.statsURL)
	if err != nil {
		t.Fatal(err)
	}

	// The attack.
	actx, cancelAttack := context.WithTimeout(ctx, attackFor)
	defer cancelAttack()
	var tally tallies
	var attack sync.WaitGroup
	// HOSTILE_LOOPS (comma-separated: own, users, stale, tokens, revoked,
	// webhook) runs only those loops, to see which one costs what.
	only := os.Getenv("HOSTILE_LOOPS")
	attackStart := time.Now()
	var tookMu sync.Mutex
	took := map[string]time.Duration{} // how long each loop ran
	attackWith := func(name string, loop func()) {
		if only == "" || slices.Contains(strings.Split(only, ","), name) {
			attack.Go(func() {
				loop()
				tookMu.Lock()
				defer tookMu.Unlock()
				took[name] = time.Since(attackStart)
			})
		}
	}
	watchPath := "/api/v1/namespaces/" + attackNS + "/configmaps?watch=true&timeoutSeconds=300"
	// Watches in its own name and as made-up users, held until the attack
	// ends: over HTTP/2, a few hundred streams a connection.
	ownClients, userClients := newClients(8, "127.0.0.1"), newClients(8, "127.0.0.1")
	attackWith("own", func() {
		holdWatches(actx, &tally, "own watches", ownClients, p.url+watchPath, attacker.Token, 3000, func(int) []string { return nil })
	})
	attackWith("users", func() {
		holdWatches(actx, &tally, "watches as made-up users", userClients, p.url+watchPath, attacker.Token, 5000, func(i int) []string {
			return []string{"Impersonate-User", fmt.Sprintf("made-up-%d", i)}
		})
	})
	// The stale storm: concurrent watches from one compacted version.
	stormClients := newClients(4, "127.0.0.1")
	attackWith("stale", func() {
		stalePath := p.url + "/api/v1/namespaces/" + attackNS + "/configmaps?watch=true&timeoutSeconds=5&resourceVersion=" + stale
		pace := spread(20000, attackFor, 64)
		requests(actx, &tally, "stale-version watches", stormClients, 64, 20000, func(int) (string, string, []string) {
			_ = pace.Wait(actx)
			return stalePath, attacker.Token, nil
		})
	})
	// Random tokens from eight addresses of one /24.
	var floodClients []*http.Client
	for i := 2; i < 10; i++ {
		floodClients = append(floodClients, newClients(1, fmt.Sprintf("127.0.0.%d", i))...)
	}
	attackWith("tokens", func() {
		listPath := p.url + "/api/v1/namespaces/" + attackNS + "/configmaps"
		pace := spread(50000, attackFor, 32)
		requests(actx, &tally, "random tokens", floodClients, 32, 50000, func(int) (string, string, []string) {
			_ = pace.Wait(actx)
			return listPath, randomString(32), nil
		})
	})
	// The token of the deleted pod, ten times a second.
	revokedClients := newClients(1, "127.0.0.1")
	attackWith("revoked", func() {
		listPath := p.url + "/api/v1/namespaces/" + attackNS + "/configmaps"
		for i := 0; i < int(attackFor/(100*time.Millisecond)) && actx.Err() == nil; i++ {
			requests(actx, &tally, "deleted pod's token", revokedClients, 1, 1, func(int) (string, string, []string) { return listPath, deletedPodToken, nil })
			time.Sleep(100 * time.Millisecond)
		}
	})

	// Admission reviews at the webhook port: pods of 2.9 MiB (under its
	// body limit) and bodies of 6 MiB (over it).
	webhookClients := newClients(2, "127.0.0.1")
	for _, size := range []int{29 << 20 / 10, 6 << 20} {
		body := admissionReview(attackNS, size)
		attackWith("webhook", func() {
			requestsWith(actx, &tally, fmt.Sprintf("admission reviews of %.1f MiB", float64(size)/(1<<20)), webhookClients, 4, 2000, func(int) *http.Request {
				req, _ := http.NewRequestWithContext(actx, http.MethodPost, "https://"+webhookAddr+inject.WebhookPath, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				return req
			})
		})
	}

	// The victim restarts every 15 s while the attack runs, the first 5 s in.
	var syncs, directSyncs []time.Duration
	restartAt := time.Now().Add(5 * time.Second)
	for actx.Err() == nil && time.Until(restartAt) < time.Until(deadlineOf(actx)) {
		time.Sleep(time.Until(restartAt))
		agent.stop()
		pids := childPids("kube-apiserver", "etcd", "watchgate")
		cpu0 := readCPU(pids)
		apiBefore, _ := e.Metrics(ctx)
		restarted := time.Now()
		var controlled sync.WaitGroup
		var dd time.Duration
		var derr error
		controlled.Go(func() {
			dd, derr = control.start()
			control.stop()
		})
		d, err := agent.start()
		controlled.Wait()
		if err != nil || derr != nil {
			t.Errorf("restart during the attack: through watchgate %v, straight %v", err, derr)
			break
		}
		syncs, directSyncs = append(syncs, d), append(directSyncs, dd)
		t.Logf("restart %d during the attack: synced in %v (straight to kube-apiserver at the same time: %v)", len(syncs), d, dd)
		cpu1 := readCPU(pids)
		apiAfter, _ := e.Metrics(ctx)
		t.Logf("  cpu: %s", cpu1.minus(cpu0))
		t.Logf("  informers synced, through watchgate: %s", spreadOf(agent.each))
		t.Logf("  informers synced, straight: %s", spreadOf(control.each))
		t.Logf("  through watchgate: %s", agentTrace.summary(restarted, 5))
		t.Logf("  straight: %s", controlTrace.summary(restarted, 5))
		t.Logf("  apf wait: %s", histogramDelta(apiAfter, apiBefore, "apiserver_flowcontrol_request_wait_duration_seconds", "priority_level", nil))
		t.Logf("  apf execution: %s", histogramDelta(apiAfter, apiBefore, "apiserver_flowcontrol_request_execution_seconds", "priority_level", nil))
		t.Logf("  apiserver durations by verb: %s", histogramDelta(apiAfter, apiBefore, "apiserver_request_duration_seconds", "verb", nil))
		t.Logf("  apiserver watch init: %s", histogramDelta(apiAfter, apiBefore, "apiserver_watch_list_duration_seconds", "resource", nil))
		t.Logf("  apf rejected: %v", apiserver.SumBy(apiAfter, "apiserver_flowcontrol_rejected_requests_total", "priority_level", nil))
		restartAt = restartAt.Add(15 * time.Second)
	}
	attack.Wait()
	agent.stop()
	for _, c := range slices.Concat(ownClients, userClients, stormClients, floodClients, revokedClients, webhookClients) {
		c.CloseIdleConnections()
	}
	after, err := scrape(p.statsURL)
	if err != nil {
		t.Fatal(err)
	}

	worst := slices.Max(append([]time.Duration{0}, syncs...))
	if len(syncs) == 0 {
		t.Error("the victim never restarted during the attack")
	}
	for i, d := range syncs {
		if d > 2*quiet {
			t.Errorf("restart %d during the attack synced in %v, more than twice the quiet %v", i+1, d, quiet)
		}
	}
	if n := victim429.Load(); n != 0 {
		t.Errorf("the victim got %d × 429", n)
	}
	if peak.Load() >= limit {
		t.Errorf("peak RSS %d MiB reached the chart's limit %d MiB", peak.Load()>>20, limit>>20)
	}
	if got := tally.get("deleted pod's token"); (only == "" || strings.Contains(only, "revoked")) && (len(got) != 1 || got["401"] == 0) {
		t.Errorf("the deleted pod's token got %v, want only 401", got)
	}

	delta := func(family, label string, match map[string]string) string {
		a, b := apiserver.SumBy(after, family, label, match), apiserver.SumBy(before, family, label, match)
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
	var rows [][2]string
	row := func(k, v string) { rows = append(rows, [2]string{k, v}); t.Logf("%s: %s", k, v) }
	row("victim: sync time quiet (slowest of 3 starts)", quiet.Round(time.Millisecond).String())
	row("victim: sync time during the attack, each restart", durations(syncs))
	row("victim: worst sync during the attack", fmt.Sprintf("%v (%.2f× quiet)", worst.Round(time.Millisecond), float64(worst)/float64(quiet)))
	row("victim: 429s received", strconv.FormatInt(victim429.Load(), 10))
	row("control, the same agent straight to kube-apiserver: quiet (slowest of 3); at each restart during the attack",
		fmt.Sprintf("%v; %s", directQuiet.Round(time.Millisecond), durations(directSyncs)))
	row("replica: peak RSS (limit 512 MiB, GOMEMLIMIT 460 MiB)", fmt.Sprintf("%d MiB", peak.Load()>>20))
	row("reviews sent during the attack (watchgate_proxy_reviews_sent_total)", delta("watchgate_proxy_reviews_sent_total", "review", nil))
	row("guard refusals by reason (watchgate_proxy_guard_rejections_total)", delta("watchgate_proxy_guard_rejections_total", "reason", nil))
	row("budget rejections by reason (watchgate_proxy_requests_total{decision=\"reject\"})", delta("watchgate_proxy_requests_total", "reason", map[string]string{"decision": "reject"}))
	row("budget dry-run rejections by reason (decision=\"dryrun-reject\")", delta("watchgate_proxy_requests_total", "reason", map[string]string{"decision": "dryrun-reject"}))
	for _, name := range tally.names() {
		row("attacker: "+name+", answers", tally.String(name))
	}
	var ran []string
	for _, name := range sortedKeys(took) {
		ran = append(ran, fmt.Sprintf("%s %v", name, took[name].Round(100*time.Millisecond)))
	}
	row("attacker: each loop ran for (it ends at its count or at the attack's end)", strings.Join(ran, ", "))

	load1 := loadAvg()
	commit, _ := exec.Command("git", "-C", root, "describe", "--always", "--dirty").Output()
	var b strings.Builder
	loops := ""
	if only != "" {
		loops = " HOSTILE_LOOPS=" + only
	}
	fmt.Fprintf(&b, "Command: `make load-hostile` (HOSTILE_ATTACK=%v%s); %s; commit %s; load average %s at the start, %s at the end; %s.\n\n",
		attackFor, loops, started.Format("2006-01-02 15:04 UTC"), strings.TrimSpace(string(commit)), load0, load1, machine())
	b.WriteString("| figure | value |\n|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s |\n", r[0], r[1])
	}
	fmt.Println(b.String())
	if out := os.Getenv("LOAD_WRITE"); out != "" {
		if err := replaceBetween(out, "<!-- hostile:begin -->", "<!-- hostile:end -->", b.String()); err != nil {
			t.Error(err)
		}
	}
}

// victimAgent is a routed agent's informers, started and stopped as a
// process restart would.
type victimAgent struct {
	cs     kubernetes.Interface
	ns     string
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// each is how long each informer of the last start took to sync.
	each []time.Duration
}

// start runs a new set of informers, one per label value, and returns how
// long they took to sync; it gives up after 2 minutes.
func (a *victimAgent) start() (time.Duration, error) {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	begin := time.Now()
	synced := make([]cache.InformerSynced, 0, victimInformers)
	for i := range victimInformers {
		inf := coreinformers.NewFilteredConfigMapInformer(a.cs, a.ns, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.LabelSelector = "informer=" + strconv.Itoa(i)
		})
		synced = append(synced, inf.HasSynced)
		a.wg.Go(func() { inf.RunWithContext(ctx) })
	}
	wctx, stop := context.WithTimeout(ctx, 2*time.Minute)
	defer stop()
	a.each = make([]time.Duration, len(synced))
	var each sync.WaitGroup
	for i, s := range synced {
		each.Go(func() {
			for wctx.Err() == nil && !s() {
				time.Sleep(10 * time.Millisecond)
			}
			a.each[i] = time.Since(begin)
		})
	}
	if !cache.WaitForCacheSync(wctx.Done(), synced...) {
		return 0, fmt.Errorf("%d informers not synced after 2m", victimInformers)
	}
	d := time.Since(begin)
	each.Wait()
	return d, nil
}

func (a *victimAgent) stop() {
	if a.cancel != nil {
		a.cancel()
		a.wg.Wait()
		a.cancel = nil
	}
}

// count429 counts the responses with status 429.
type count429 struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c *count429) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		c.n.Add(1)
	}
	return resp, err
}

// tallies counts the attacker's answers per loop by status and reason.
type tallies struct {
	mu sync.Mutex
	m  map[string]map[string]int
}

func (t *tallies) add(loop string, resp *http.Response, err error) {
	key := "error"
	if err == nil {
		key = strconv.Itoa(resp.StatusCode)
		if d := resp.Header.Get(proxy.DecisionHeader); d != "" && resp.StatusCode != http.StatusOK {
			if _, r, ok := strings.Cut(d, "reason="); ok {
				r, _, _ = strings.Cut(r, ";")
				key += " " + r
			}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]map[string]int{}
	}
	if t.m[loop] == nil {
		t.m[loop] = map[string]int{}
	}
	t.m[loop][key]++
}

func (t *tallies) get(loop string) map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for k, v := range t.m[loop] {
		out[k] = v
	}
	return out
}

func (t *tallies) names() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return sortedKeys(t.m)
}

func (t *tallies) String(loop string) string {
	m := t.get(loop)
	keys := mapKeys(m)
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s × %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func mapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// newClients returns n HTTP/2 clients of the proxy whose connections come
// from the loopback address ip.
func newClients(n int, ip string) []*http.Client {
	out := make([]*http.Client, n)
	for i := range out {
		out[i] = &http.Client{Transport: &http.Transport{
			DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext,
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // loopback, a throwaway certificate
			ForceAttemptHTTP2: true,
		}}
	}
	return out
}

// holdWatches opens up to n watches of url with token, 32 at a time, each
// with the headers of its index, and holds the admitted ones until ctx
// ends; it returns when every watch it opened has ended.
func holdWatches(ctx context.Context, tally *tallies, loop string, clients []*http.Client, url, token string, n int, headers func(int) []string) {
	var held sync.WaitGroup
	defer held.Wait()
	var next atomic.Int64
	var openers sync.WaitGroup
	for range 32 {
		openers.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				h := headers(i)
				for j := 0; j+1 < len(h); j += 2 {
					req.Header.Set(h[j], h[j+1])
				}
				resp, err := clients[i%len(clients)].Do(req)
				if ctx.Err() != nil {
					if err == nil {
						resp.Body.Close()
					}
					return
				}
				tally.add(loop, resp, err)
				if err != nil {
					continue
				}
				if resp.StatusCode != http.StatusOK {
					_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
					resp.Body.Close()
					continue
				}
				held.Go(func() {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				})
			}
		})
	}
	openers.Wait()
}

// requests sends up to n GET requests, concurrency at a time, each with
// the url, token and headers of its index, reading every answer whole;
// it stops when ctx ends.
func requests(ctx context.Context, tally *tallies, loop string, clients []*http.Client, concurrency, n int, of func(int) (string, string, []string)) {
	requestsWith(ctx, tally, loop, clients, concurrency, n, func(i int) *http.Request {
		url, token, h := of(i)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		for j := 0; j+1 < len(h); j += 2 {
			req.Header.Set(h[j], h[j+1])
		}
		return req
	})
}

// requestsWith sends up to n requests, concurrency at a time, the request
// of each index, reading every answer whole; it stops when ctx ends.
func requestsWith(ctx context.Context, tally *tallies, loop string, clients []*http.Client, concurrency, n int, of func(int) *http.Request) {
	var next atomic.Int64
	var senders sync.WaitGroup
	for range concurrency {
		senders.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				resp, err := clients[i%len(clients)].Do(of(i))
				if ctx.Err() != nil {
					if err == nil {
						resp.Body.Close()
					}
					return
				}
				tally.add(loop, resp, err)
				if err == nil {
					_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
					resp.Body.Close()
				}
			}
		})
	}
	senders.Wait()
}

// admissionReview is a pod's AdmissionReview of about size bytes, the
// pod's bulk in one annotation.
func admissionReview(ns string, size int) []byte {
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: ns, Annotations: map[string]string{"bulk": strings.Repeat("x", size)}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}}},
	}
	raw, _ := json.Marshal(pod)
	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: ns, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
		},
	})
	return body
}

// spread paces n requests evenly over d, burst at a time, so that a flood
// lasts the whole attack rather than its first seconds.
func spread(n int, d time.Duration, burst int) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(float64(n)/d.Seconds()), burst)
}

func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

func durations(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, d.Round(time.Millisecond).String())
	}
	return strings.Join(parts, ", ")
}

// scrape reads a Prometheus text endpoint.
func scrape(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(bytes.NewReader(body))
}
