//go:build load

package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
	"golang.org/x/sys/unix"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/test/apiserver"
)

// victimInformers is how many informers the routed agent runs.
const victimInformers = 70

// TestLoadHostileTenant is `make load-hostile`, not part of `make test`
// (build tag load): one watchgate replica as the chart runs it (default
// flags, GOMEMLIMIT 90% of the 512Mi limit, the chart's default budgets,
// injection on) in front of a dedicated control plane, loopback only.
//
// A routed agent (its own service account, 70 label-selected Secret
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
// the attack.
//
// It runs twice, each time on a control plane of its own
// (HOSTILE_ENFORCEMENT names one): DryRun, the chart's budgets as shipped,
// and Enforce, the same budgets enforcing. A DryRun budget forwards what
// it would refuse, so as shipped the replica forwards the stale storm as
// it forwards everything else; the DryRun run leaves that loop out, and
// the Enforce run, where the replica answers it, runs every loop.
//
// Every start of the agent, quiet or under attack, runs beside the same
// agent straight to kube-apiserver: the control, what the machine and the
// API server alone cost a sync at that moment. The attacker is a process of
// its own (testdata/attacker). With HOSTILE_CPU=own (the default) it runs
// on CPU 1 and everything under test (kube-apiserver, etcd, the
// replica, this process with the agent and its control) on CPU 0, as an
// attacker on another machine would take no CPU from the cluster; with
// HOSTILE_CPU=shared nothing is pinned.
//
// It asserts no 429 to the agent, the replica's RSS under the chart's
// limit, and a sync within twice the quiet time at every restart. The
// control's slowdown at the same moments is reported beside it, so that a
// miss can be told apart from what the machine alone cost at that moment.
// It prints the table and, with LOAD_WRITE=path, replaces the part
// of that file between <!-- hostile-dryrun:begin --> and
// <!-- hostile-dryrun:end --> (hostile-enforce for Enforce; with
// HOSTILE_CPU=shared, hostile-dryrun-shared and hostile-enforce-shared).
func TestLoadHostileTenant(t *testing.T) {
	modes := []string{"DryRun", "Enforce"}
	if m := os.Getenv("HOSTILE_ENFORCEMENT"); m != "" {
		if !slices.Contains(modes, m) {
			t.Fatalf("HOSTILE_ENFORCEMENT=%s: want DryRun or Enforce", m)
		}
		modes = []string{m}
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) { hostileTenant(t, mode) })
	}
}

// hostileTenant is one run of TestLoadHostileTenant with the chart's
// budgets in enforcement mode (DryRun or Enforce).
func hostileTenant(t *testing.T, mode string) {
	attackFor := envDuration("HOSTILE_ATTACK", 60*time.Second)
	// HOSTILE_LOOPS (comma-separated: own, users, stale, tokens, revoked,
	// webhook) runs only those loops, to see which one costs what;
	// HOSTILE_PROFILE=dir writes the CPU profiles of kube-apiserver and
	// the replica over each restart's first 5 s there.
	only := os.Getenv("HOSTILE_LOOPS")
	if only == "" && mode == "DryRun" {
		only = "own,users,tokens,revoked,webhook" // every loop but stale
	}
	cpuMode := cmp.Or(os.Getenv("HOSTILE_CPU"), "own")
	if cpuMode != "own" && cpuMode != "shared" {
		t.Fatalf("HOSTILE_CPU=%s: want own or shared", cpuMode)
	}
	ownCPU := cpuMode == "own"
	if ownCPU && runtime.NumCPU() < 2 {
		t.Fatal("HOSTILE_CPU=own needs two CPUs")
	}
	root := apiserver.RepoRoot()
	bin := filepath.Join(root, "bin", "watchgate")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s missing: run `make build` (make load-hostile does)", bin)
	}
	attackerBin := filepath.Join(t.TempDir(), "attacker")
	if out, err := exec.Command("go", "build", "-o", attackerBin, "./testdata/attacker").CombinedOutput(); err != nil {
		t.Fatalf("build the attacker: %v\n%s", err, out)
	}
	load0 := loadAvg()
	started := time.Now().UTC()

	e, err := apiserver.Start(apiserver.Options{
		// Versions go stale within seconds, for the stale storm.
		StaleVersions:     true,
		CRDDirectoryPaths: []string{filepath.Join(root, "config", "crd", "bases")},
		Args:              hostileAPIServerArgs(os.Getenv("HOSTILE_WATCH_CACHE")),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ctx := context.Background()

	// The victim: its own service account and one Secret per informer.
	victimNS := uniqueName("victim")
	victim, err := e.ServiceAccount(ctx, victimNS, "agent")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Grant(ctx, victim, readWatch("secrets")); err != nil {
		t.Fatal(err)
	}
	for i := range victimInformers {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("item-%d", i), Labels: map[string]string{"informer": strconv.Itoa(i)}}}
		if _, err := e.Clientset.CoreV1().Secrets(victimNS).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
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
	if err := e.WaitAllowed(ctx, attackNS, "anyone", []string{"system:authenticated"}, readWatch("configmaps")); err != nil {
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
	stale := ""
	if only == "" || slices.Contains(strings.Split(only, ","), "stale") {
		if os.Getenv("HOSTILE_WATCH_CACHE") == "true" {
			t.Fatal("the stale storm needs versions that go stale in seconds: ConfigMaps without a watch cache (leave out stale from HOSTILE_LOOPS)")
		}
		if stale, err = e.StaleVersion(ctx, attackNS, 20, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
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
	budgets := budgetsIn(t, chartBudgets(t, root), mode)
	const limit = 512 << 20
	goMemLimit := limit * 9 / 10
	flags := []string{"--tls-cert-file=" + filepath.Join(dir, "tls.crt"), "--tls-private-key-file=" + filepath.Join(dir, "tls.key"),
		"--webhook-port=" + webhookPort, "--pod-namespace=watchgate-system", budgets}
	profiles := os.Getenv("HOSTILE_PROFILE")
	pprofAddr := ""
	if profiles != "" {
		if pprofAddr, err = apiserver.FreeAddr(); err != nil {
			t.Fatal(err)
		}
		flags = append(flags, "--pprof-bind-address="+pprofAddr)
	}
	p := startWatchgate(t, e, bin, []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", goMemLimit>>20)}, flags...)
	peakRSS := p.peakRSS(250 * time.Millisecond)
	defer peakRSS()

	// With its own CPU, everything under test (kube-apiserver, etcd, the
	// replica, this test with the victim and the control) runs on CPU 0,
	// quiet and under attack alike, and the attacker on CPU 1.
	pids := childPids("kube-apiserver", "etcd", "watchgate")
	if ownCPU {
		for name, pid := range pids {
			if err := pinProcess(pid, 0); err != nil {
				t.Fatalf("pin %s to CPU 0: %v", name, err)
			}
		}
	}

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
	// The same agent straight to kube-apiserver: what the machine and the
	// API server alone cost a sync at the same moment.
	direct := rest.CopyConfig(e.ConfigFor(victim.Token, "", nil))
	direct.QPS, direct.Burst = cfg.QPS, cfg.Burst
	direct.WrapTransport = controlTrace.wrap
	dcs, err := kubernetes.NewForConfig(direct)
	if err != nil {
		t.Fatal(err)
	}
	control := &victimAgent{cs: dcs, ns: victimNS}
	// both starts the agent and the control at once, as every restart does.
	both := func() (time.Duration, time.Duration, error) {
		var dd time.Duration
		var derr error
		var controlled sync.WaitGroup
		controlled.Go(func() {
			dd, derr = control.start()
			control.stop()
		})
		d, err := agent.start()
		controlled.Wait()
		if err != nil || derr != nil {
			return 0, 0, fmt.Errorf("through watchgate %w, straight %w", err, derr)
		}
		return d, dd, nil
	}

	// Quiet: a first start that warms the caches on the way (not
	// counted), then three starts, each with its control; the slowest is
	// the quiet time, each half a second after the one before. Enforcing
	// budgets back off watches that end sooner than their short-watch
	// time, as an agent's restart loop's do, so there the agent's watches
	// live past it before every restart, quiet or under attack.
	pause := 500 * time.Millisecond
	var live time.Duration
	if mode == "Enforce" {
		live = shortWatchOf(t, budgets) + time.Second
	}
	var quiet, directQuiet time.Duration
	for i := range 4 {
		seats := seatSampler(p.statsURL)
		started := time.Now()
		d, dd, err := both()
		seatRange := seats()
		if err != nil {
			t.Fatalf("quiet start: %v", err)
		}
		time.Sleep(time.Until(started.Add(live)))
		agent.stop()
		t.Logf("quiet start %d: %v, straight %v; the replica's watch-open seat limit %s", i, d, dd, seatRange)
		if i > 0 {
			quiet, directQuiet = max(quiet, d), max(directQuiet, dd)
		}
		time.Sleep(pause)
	}
	if _, err := agent.start(); err != nil {
		t.Fatalf("start before the attack: %v", err)
	}
	firstRestart := 5 * time.Second
	time.Sleep(live - firstRestart)
	before, err := scrape(p.statsURL)
	if err != nil {
		t.Fatal(err)
	}

	// The attack, in its own process.
	args := []string{"-proxy=" + p.url, "-webhook=" + webhookAddr, "-namespace=" + attackNS, "-token=" + attacker.Token,
		"-revoked-token=" + deletedPodToken, "-stale=" + stale, "-for=" + attackFor.String(), "-loops=" + only}
	if ownCPU {
		args = append(args, "-cpu=1")
	}
	var attackOut, attackErr bytes.Buffer
	attack := exec.Command(attackerBin, args...)
	attack.Stdout, attack.Stderr = &attackOut, &attackErr
	attackStart := time.Now()
	if err := attack.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if attack.ProcessState == nil { // the test stopped before the attack ended
			_ = attack.Process.Kill()
			_ = attack.Wait()
		}
	})
	pids["attacker"] = attack.Process.Pid
	attackEnds := attackStart.Add(attackFor)
	attacked := readCPU(pids)

	// The victim restarts every 15 s while the attack runs, the first 5 s
	// in, each time with its control.
	var syncs, directSyncs []time.Duration
	for restartAt := attackStart.Add(firstRestart); restartAt.Before(attackEnds); restartAt = restartAt.Add(15 * time.Second) {
		time.Sleep(time.Until(restartAt))
		agent.stop()
		cpu0 := readCPU(pids)
		apiBefore, _ := e.Metrics(ctx)
		restarted := time.Now()
		var profiled sync.WaitGroup
		if profiles != "" {
			// CPU profiles of kube-apiserver (its --profiling is on by
			// default) and of the replica over the restart's first 5 s,
			// for `go tool pprof`.
			profile := func(name string, get func() ([]byte, error)) {
				profiled.Go(func() {
					prof, err := get()
					if err == nil {
						err = os.WriteFile(filepath.Join(profiles, fmt.Sprintf("%s-restart-%d.pprof", name, len(syncs)+1)), prof, 0o644)
					}
					if err != nil {
						t.Logf("profile %s: %v", name, err)
					}
				})
			}
			profile("kube-apiserver", func() ([]byte, error) {
				return e.Clientset.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "5").DoRaw(ctx)
			})
			profile("watchgate", func() ([]byte, error) {
				resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/profile?seconds=5")
				if err != nil {
					return nil, err
				}
				defer resp.Body.Close()
				return io.ReadAll(resp.Body)
			})
		}
		seats := seatSampler(p.statsURL)
		d, dd, err := both()
		seatRange := seats()
		profiled.Wait()
		if err != nil {
			t.Errorf("restart during the attack: %v", err)
			break
		}
		cpu1 := readCPU(pids)
		syncs, directSyncs = append(syncs, d), append(directSyncs, dd)
		t.Logf("restart %d during the attack: synced in %v (straight to kube-apiserver at the same time: %v)", len(syncs), d, dd)
		apiAfter, _ := e.Metrics(ctx)
		t.Logf("  CPU while it ran: %s; the replica's watch-open seat limit %s", cpu1.minus(cpu0), seatRange)
		t.Logf("  informers synced, through watchgate: %s; straight: %s", spreadOf(agent.each), spreadOf(control.each))
		t.Logf("  through watchgate: %s", agentTrace.summary(restarted, 3))
		t.Logf("  straight: %s", controlTrace.summary(restarted, 3))
		t.Logf("  API server: flow-control wait %s; watch-list init %s; %.0f requests by verb %v; %.0f watches held at the end",
			histogramDelta(apiAfter, apiBefore, "apiserver_flowcontrol_request_wait_duration_seconds", "priority_level", nil),
			histogramDelta(apiAfter, apiBefore, "apiserver_watch_list_duration_seconds", "resource", nil),
			apiserver.Sum(apiAfter, "apiserver_request_total", nil)-apiserver.Sum(apiBefore, "apiserver_request_total", nil),
			counterDelta(apiAfter, apiBefore, "apiserver_request_total", "verb"),
			apiserver.Sum(apiAfter, "apiserver_longrunning_requests", map[string]string{"verb": "WATCH"}))
	}
	waitErr := attack.Wait()
	delete(pids, "attacker")
	cpuAttack := fmt.Sprintf("attacker %.2fs, %s", (attack.ProcessState.UserTime() + attack.ProcessState.SystemTime()).Seconds(), readCPU(pids).minus(attacked))
	agent.stop()
	if waitErr != nil {
		t.Fatalf("attacker: %v\n%s", waitErr, attackErr.String())
	}
	var report struct {
		Answers map[string]map[string]int `json:"answers"`
		Took    map[string]string         `json:"took"`
	}
	if err := json.Unmarshal(attackOut.Bytes(), &report); err != nil {
		t.Fatalf("attacker's report %q: %v\n%s", attackOut.String(), err, attackErr.String())
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
		if slowdown := float64(d) / float64(quiet); slowdown > 2 {
			t.Errorf("restart %d during the attack synced in %v, %.2f× the quiet %v (want within 2×), while the same agent straight to kube-apiserver took %.2f× its quiet time",
				i+1, d, slowdown, quiet, float64(directSyncs[i])/float64(directQuiet))
		}
	}
	if n := victim429.Load(); n != 0 {
		t.Errorf("the victim got %d × 429", n)
	}
	peak := peakRSS()
	if peak >= limit {
		t.Errorf("peak RSS %d MiB reached the chart's limit %d MiB", peak>>20, limit>>20)
	}
	if got := report.Answers["deleted pod's token"]; (only == "" || strings.Contains(only, "revoked")) && (len(got) != 1 || got["401"] == 0) {
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
	ratios := func(ds []time.Duration, base time.Duration) string {
		var parts []string
		for _, d := range ds {
			parts = append(parts, fmt.Sprintf("%.2f×", float64(d)/float64(base)))
		}
		return strings.Join(parts, ", ")
	}
	var rows [][2]string
	row := func(k, v string) { rows = append(rows, [2]string{k, v}); t.Logf("%s: %s", k, v) }
	row("the chart's budgets", map[string]string{"DryRun": "as shipped (DryRun)", "Enforce": "set to Enforce"}[mode])
	row("attacker's loops", cmp.Or(only, "every one"))
	row("attacker's CPU", map[bool]string{true: "its own (CPU 1; everything under test on CPU 0)", false: "shared (nothing pinned)"}[ownCPU])
	row("victim: sync time quiet (slowest of 3 starts)", quiet.Round(time.Millisecond).String())
	row("victim: sync time during the attack, each restart", durations(syncs)+" ("+ratios(syncs, quiet)+" quiet)")
	row("victim: worst sync during the attack", fmt.Sprintf("%v (%.2f× quiet)", worst.Round(time.Millisecond), float64(worst)/float64(quiet)))
	row("victim: 429s received", strconv.FormatInt(victim429.Load(), 10))
	row("control, the same agent straight to kube-apiserver at the same moments: quiet (slowest of 3); at each restart during the attack",
		fmt.Sprintf("%v; %s (%s quiet)", directQuiet.Round(time.Millisecond), durations(directSyncs), ratios(directSyncs, directQuiet)))
	row("CPU time over the attack, by process", cpuAttack)
	row("replica: peak RSS (limit 512 MiB, GOMEMLIMIT 460 MiB)", fmt.Sprintf("%d MiB", peak>>20))
	row("reviews sent during the attack (watchgate_proxy_reviews_sent_total)", delta("watchgate_proxy_reviews_sent_total", "review", nil))
	row("guard refusals by reason (watchgate_proxy_guard_rejections_total)", delta("watchgate_proxy_guard_rejections_total", "reason", nil))
	row("budget rejections by reason (watchgate_proxy_requests_total{decision=\"reject\"})", delta("watchgate_proxy_requests_total", "reason", map[string]string{"decision": "reject"}))
	row("budget dry-run rejections by reason (decision=\"dryrun-reject\")", delta("watchgate_proxy_requests_total", "reason", map[string]string{"decision": "dryrun-reject"}))
	for _, name := range sortedKeys(report.Answers) {
		row("attacker: "+name+", answers", answersString(report.Answers[name]))
	}
	var ran []string
	for _, name := range sortedKeys(report.Took) {
		ran = append(ran, name+" "+report.Took[name])
	}
	row("attacker: each loop ran for (it ends at its count or at the attack's end)", strings.Join(ran, ", "))

	load1 := loadAvg()
	commit, _ := exec.Command("git", "-C", root, "describe", "--always", "--dirty").Output()
	var b strings.Builder
	opts := fmt.Sprintf("HOSTILE_ENFORCEMENT=%s HOSTILE_ATTACK=%v HOSTILE_CPU=%s", mode, attackFor, cpuMode)
	if only != "" {
		opts += " HOSTILE_LOOPS=" + only
	}
	fmt.Fprintf(&b, "Command: `make load-hostile` (%s); %s; commit %s; load average %s at the start, %s at the end; %s.\n\n",
		opts, started.Format("2006-01-02 15:04 UTC"), strings.TrimSpace(string(commit)), load0, load1, machine())
	b.WriteString("| figure | value |\n|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s |\n", r[0], r[1])
	}
	fmt.Println(b.String())
	if out := os.Getenv("LOAD_WRITE"); out != "" {
		marker := "hostile-" + strings.ToLower(mode)
		if !ownCPU {
			marker += "-shared"
		}
		if err := replaceBetween(out, "<!-- "+marker+":begin -->", "<!-- "+marker+":end -->", b.String()); err != nil {
			t.Error(err)
		}
	}
}

// budgetsIn returns the --bootstrap-budgets flag with every budget that
// enforces (DryRun or Enforce, set or defaulted) set to mode; Exempt
// budgets stay exempt.
func budgetsIn(t *testing.T, flag, mode string) string {
	t.Helper()
	bs, err := controllers.ParseBootstrapBudgets(strings.TrimPrefix(flag, "--bootstrap-budgets="))
	if err != nil {
		t.Fatalf("the chart's budgets: %v", err)
	}
	set := 0
	for i := range bs {
		if bs[i].Spec["enforcement"] != "Exempt" {
			bs[i].Spec["enforcement"] = mode
			set++
		}
	}
	if set == 0 {
		t.Fatalf("the chart's budgets have no enforcing budget to set to %s: %s", mode, flag)
	}
	b, err := json.Marshal(bs)
	if err != nil {
		t.Fatal(err)
	}
	return "--bootstrap-budgets=" + string(b)
}

// shortWatchOf returns the longest short-watch time (backoff) of the
// --bootstrap-budgets flag's budgets, defaults included, read as the
// proxy reads them (controllers.ParseBootstrapBudgets, ToBudget).
func shortWatchOf(t *testing.T, flag string) time.Duration {
	t.Helper()
	bs, err := controllers.ParseBootstrapBudgets(strings.TrimPrefix(flag, "--bootstrap-budgets="))
	if err != nil {
		t.Fatalf("the chart's budgets: %v", err)
	}
	var longest time.Duration
	for i := range bs {
		b, err := bs[i].Budget()
		if err != nil {
			t.Fatalf("the chart's budgets: %v", err)
		}
		longest = max(longest, b.Backoff.ShortWatch)
	}
	return longest
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
		inf := coreinformers.NewFilteredSecretInformer(a.cs, a.ns, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.LabelSelector = "informer=" + strconv.Itoa(i)
		})
		synced = append(synced, inf.HasSynced)
		a.wg.Go(func() { inf.RunWithContext(ctx) })
	}
	wctx, stop := context.WithTimeout(ctx, 2*time.Minute)
	defer stop()
	// Each informer is watched on its own, every 10 ms, rather than with
	// cache.WaitForCacheSync, which looks every 100 ms.
	a.each = make([]time.Duration, len(synced))
	var each sync.WaitGroup
	var late atomic.Int64
	for i, s := range synced {
		each.Go(func() {
			for !s() {
				select {
				case <-wctx.Done():
					late.Add(1)
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
			a.each[i] = time.Since(begin)
		})
	}
	each.Wait()
	if n := late.Load(); n > 0 {
		return 0, fmt.Errorf("%d informers not synced after 2m", n)
	}
	return slices.Max(a.each), nil
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

// RoundTrip counts 429s and prints the first five with watchgate's
// decision, to stderr: a request may still be in flight when the test
// ends, after which t.Log would panic.
func (c *count429) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		if c.n.Add(1) <= 5 {
			fmt.Fprintf(os.Stderr, "victim: 429 for %s %s: %s %q\n", req.Method, req.URL.RequestURI(), resp.Header.Get("X-Watchgate-Decision"), resp.Header.Get("Retry-After"))
		}
	}
	return resp, err
}

// answersString is a loop's answers, the most frequent first.
func answersString(m map[string]int) string {
	keys := mapKeys(m)
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s × %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// pinProcess runs every thread of pid on cpu only; the threads it starts
// later inherit that.
func pinProcess(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			return err
		}
	}
	return nil
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

// hostileAPIServerArgs are the dedicated kube-apiserver's flags for a
// HOSTILE_WATCH_CACHE setting. By default ("") its watch cache is on, as on
// every cluster, except for ConfigMaps, the attacker's resource, whose
// versions must go stale within seconds for the stale storm (the etcd
// compaction of apiserver.Options.StaleVersions reaches them only
// uncached); the victim watches Secrets, from the cache. "true": every
// resource cached (no stale storm); "false": none.
func hostileAPIServerArgs(watchCache string) map[string]string {
	args := map[string]string{"http2-max-streams-per-connection": "2000", "watch-cache": "true"}
	switch watchCache {
	case "":
		args["watch-cache-sizes"] = "configmaps#0"
	case "false":
		args["watch-cache"] = "false"
	}
	return args
}
