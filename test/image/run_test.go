package image

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/test/apiserver"
)

// TestImageRunsAsTheChartDeploysIt installs the chart, then runs the
// linux/amd64 image of the current sources the way its Deployment would
// (see the package documentation for what is emulated and how), and
// talks to the proxy in it: it turns ready, passes a watch, and answers a
// watch from a stale resourceVersion with the API server's 410 Expired.
func TestImageRunsAsTheChartDeploysIt(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("running the image needs root: chroot into its root filesystem, then setuid to its user")
	}
	const release, ns, podName = "watchgate", "watchgate-system", "watchgate-image-test"
	img := imageFor(t, filepath.Join(cachedImage(t, "linux/amd64"), "oci"), "amd64")
	dep := installedDeployment(t, release, ns)
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]

	ids := runAs(t, img, dep)
	if c.SecurityContext == nil || !ptr.Deref(c.SecurityContext.ReadOnlyRootFilesystem, false) {
		t.Error("the chart does not set readOnlyRootFilesystem; the test makes the root read-only regardless")
	}

	// The root filesystem: the image's layers, then read-only.
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if notRoot := img.unpack(t, rootfs); len(notRoot) > 0 {
		t.Errorf("the image holds entries not owned by root, which its user could change: %v", notRoot)
	}
	readOnly(t, rootfs)

	// What the kubelet mounts.
	mountVolumes(t, rootfs, pod, c, ns, ids)
	if !ptr.Deref(pod.AutomountServiceAccountToken, true) {
		t.Fatal("the chart's pod does not mount its service-account token, which the in-cluster configuration reads")
	}
	mountServiceAccount(t, rootfs, ns, pod.ServiceAccountName, ids)

	argv, addrs := commandLine(t, img, c)
	environ := environment(t, img, c, podName, ns)

	log := &apiserver.LockedBuffer{}
	cmd := &exec.Cmd{
		Path:   argv[0],
		Args:   argv,
		Env:    environ,
		Dir:    "/",
		Stdout: log,
		Stderr: log,
		SysProcAttr: &syscall.SysProcAttr{
			Chroot:     rootfs,
			Credential: &syscall.Credential{Uid: ids.uid, Gid: ids.gid, Groups: ids.groups},
			Pdeathsig:  syscall.SIGKILL,
		},
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v in %s: %v", argv, rootfs, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(90 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("watchgate did not stop within 90s of SIGTERM")
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("watchgate's log:\n%s", log.String())
		}
	})

	apiserver.WaitWhileRunning(t, exited, &waitErr, 2*time.Minute, "/readyz", func() bool {
		resp, err := http.Get("http://" + addrs["health"] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	checkProcess(t, cmd.Process.Pid, rootfs, ids)

	// A client that may read ConfigMaps in its namespace, trusting the
	// chart's CA for the Service's name.
	ctx := t.Context()
	sa, err := env.ServiceAccount(ctx, "image-client", "reader")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Grant(ctx, sa, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}); err != nil {
		t.Fatal(err)
	}
	// /metrics is served as the chart serves it: HTTPS, to scrapers the API
	// server allows get /metrics.
	scraper, err := env.ServiceAccount(ctx, "image-client", "scraper")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Grant(ctx, scraper, rbacv1.PolicyRule{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}); err != nil {
		t.Fatal(err)
	}
	stale, err := env.StaleVersion(ctx, "image-client", 100, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := env.Clientset.CoreV1().Secrets(ns).Get(ctx, release+"-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := env.ConfigFor(sa.Token, "https://"+addrs["https"], secret.Data["ca.crt"])
	cfg.TLSClientConfig.ServerName = release + "." + ns + ".svc"
	path := "/api/v1/namespaces/image-client/configmaps"

	// A watch from "0" starts with the current ConfigMaps.
	ans, err := apiserver.WatchFor(ctx, cfg, path, "0", 3*time.Second)
	if err != nil {
		t.Fatalf("watch through the image's proxy: %v", err)
	}
	if ans.HTTPStatus != http.StatusOK || len(ans.Events) == 0 || ans.Events[0].Type != "ADDED" {
		t.Errorf("watch through the image's proxy: HTTP %d, %d events (first %+v), want 200 and ADDED events", ans.HTTPStatus, len(ans.Events), first(ans.Events))
	}
	// A watch from the stale version gets the API server's answer, which
	// the proxy learns.
	for i := range 2 {
		ans, err := apiserver.WatchFor(ctx, cfg, path, stale, 10*time.Second)
		if err != nil {
			t.Fatalf("stale watch %d through the image's proxy: %v", i+1, err)
		}
		if ans.HTTPStatus != http.StatusOK || ans.Code != http.StatusGone || ans.Status.Reason != metav1.StatusReasonExpired || !ans.Closed {
			t.Errorf("stale watch %d through the image's proxy: HTTP %d, code %d %s, closed %v; want 200 with one ERROR 410 Expired, then the end",
				i+1, ans.HTTPStatus, ans.Code, ans.Status.Reason, ans.Closed)
		}
	}
	if learned := metric(t, addrs["metrics"], scraper.Token, "watchgate_proxy_stale_versions_learned_total"); learned < 1 {
		t.Errorf("watchgate_proxy_stale_versions_learned_total = %v, want at least 1", learned)
	}

	// The kubelet stops a pod with SIGTERM; watchgate ends cleanly.
	stop()
	if waitErr != nil {
		t.Errorf("watchgate exited with %v after SIGTERM, want 0", waitErr)
	}
}

// effectiveIDs are the user, group and supplementary groups the container
// runs with: the container's securityContext over the pod's, over the
// image's USER.
type effectiveIDs struct {
	uid, gid uint32
	groups   []uint32
	fsGroup  *int64
}

func (ids effectiveIDs) String() string {
	return fmt.Sprintf("%d:%d (groups %v)", ids.uid, ids.gid, ids.groups)
}

// runAs returns the ids the Deployment's container runs with, and checks
// they agree with the image's USER and with runAsNonRoot.
func runAs(t *testing.T, img ociImage, dep *appsv1.Deployment) effectiveIDs {
	t.Helper()
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	user, group, ok := strings.Cut(img.config.Config.User, ":")
	uid, err1 := strconv.ParseInt(user, 10, 64)
	gid, err2 := strconv.ParseInt(group, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("image USER %q: want numeric uid:gid, so that runAsNonRoot can check it", img.config.Config.User)
	}
	nonRoot := false
	var supplementary []int64
	if psc := pod.SecurityContext; psc != nil {
		uid, gid = ptr.Deref(psc.RunAsUser, uid), ptr.Deref(psc.RunAsGroup, gid)
		nonRoot = ptr.Deref(psc.RunAsNonRoot, false)
		supplementary = psc.SupplementalGroups
	}
	if csc := c.SecurityContext; csc != nil {
		uid, gid = ptr.Deref(csc.RunAsUser, uid), ptr.Deref(csc.RunAsGroup, gid)
		nonRoot = ptr.Deref(csc.RunAsNonRoot, nonRoot)
	}
	if img.config.Config.User != fmt.Sprintf("%d:%d", uid, gid) {
		t.Errorf("the chart runs the container as %d:%d, the image's USER is %s", uid, gid, img.config.Config.User)
	}
	if !nonRoot || uid == 0 {
		t.Errorf("runAsNonRoot %v with uid %d: want a non-root user the kubelet verifies", nonRoot, uid)
	}
	ids := effectiveIDs{uid: uint32(uid), gid: uint32(gid), groups: []uint32{uint32(gid)}}
	if pod.SecurityContext != nil && pod.SecurityContext.FSGroup != nil {
		ids.fsGroup = pod.SecurityContext.FSGroup
		supplementary = append(supplementary, *ids.fsGroup)
	}
	for _, g := range supplementary {
		if !slices.Contains(ids.groups, uint32(g)) {
			ids.groups = append(ids.groups, uint32(g))
		}
	}
	return ids
}

// readOnly removes every write permission under root, as mounting it
// read-only would (only root, the test, may still write).
func readOnly(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.Chmod(p, info.Mode()&^0o222&(fs.ModePerm|fs.ModeSticky|fs.ModeSetgid|fs.ModeSetuid))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// mkMount creates the mount point p (absolute, in the container) under
// root as the runtime does: missing parents owned by root.
func mkMount(t *testing.T, root, p string) string {
	t.Helper()
	dir := filepath.Join(root, filepath.FromSlash(p))
	if err := os.MkdirAll(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	return dir
}

// mountVolumes provides the container's volumeMounts: an emptyDir as an
// empty folder the pod's fsGroup may write, a Secret's keys as files of
// the release's Secret, readable by the fsGroup. Other kinds fail the
// test: it would not know how to provide them.
func mountVolumes(t *testing.T, root string, pod corev1.PodSpec, c corev1.Container, ns string, ids effectiveIDs) {
	t.Helper()
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	group := -1
	if ids.fsGroup != nil {
		group = int(*ids.fsGroup)
	}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Fatalf("volumeMount %s names no volume", m.Name)
		}
		dir := mkMount(t, root, m.MountPath)
		switch {
		case v.EmptyDir != nil:
			if m.ReadOnly {
				t.Fatalf("the emptyDir %s is mounted read-only", m.Name)
			}
			if err := os.Chown(dir, 0, group); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, fs.ModeSetgid|0o777); err != nil {
				t.Fatal(err)
			}
		case v.Secret != nil:
			s, err := env.Clientset.CoreV1().Secrets(ns).Get(t.Context(), v.Secret.SecretName, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the Secret the chart mounts at %s: %v", m.MountPath, err)
			}
			mode := fs.FileMode(ptr.Deref(v.Secret.DefaultMode, 0o644))
			for k, b := range s.Data {
				writeOwned(t, filepath.Join(dir, k), b, mode, 0, group)
			}
		default:
			t.Fatalf("the chart mounts volume %s, of a kind the test cannot provide", m.Name)
		}
	}
}

// mountServiceAccount provides what the kubelet mounts for a pod of the
// service account: a token of it (from the TokenRequest API), the API
// server's CA and the namespace, where rest.InClusterConfig reads them.
func mountServiceAccount(t *testing.T, root, ns, name string, ids effectiveIDs) {
	t.Helper()
	if name == "" {
		t.Fatal("the chart's pod names no serviceAccountName")
	}
	tr, err := env.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token for the chart's ServiceAccount %s/%s: %v", ns, name, err)
	}
	dir := mkMount(t, root, "/var/run/secrets/kubernetes.io/serviceaccount")
	// The token is readable by the fsGroup, else by the user alone.
	uid, mode := 0, fs.FileMode(0o640)
	var gid int
	if ids.fsGroup != nil {
		gid = int(*ids.fsGroup)
	} else {
		uid, gid, mode = int(ids.uid), int(ids.gid), 0o600
	}
	writeOwned(t, filepath.Join(dir, "token"), []byte(tr.Status.Token), mode, uid, gid)
	writeOwned(t, filepath.Join(dir, "ca.crt"), env.Config.CAData, 0o644, 0, gid)
	writeOwned(t, filepath.Join(dir, "namespace"), []byte(ns), 0o644, 0, gid)
}

func writeOwned(t *testing.T, path string, data []byte, mode fs.FileMode, uid, gid int) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// commandLine is the process's argv as the runtime builds it from the
// image's entrypoint and cmd and the container's command and args. Each
// bind address on a container port (":8443") becomes a free loopback
// address, since the process shares the test's network: the one change
// to the arguments. It returns the addresses by port name.
func commandLine(t *testing.T, img ociImage, c corev1.Container) ([]string, map[string]string) {
	t.Helper()
	argv := img.config.Config.Entrypoint
	args := img.config.Config.Cmd
	if len(c.Command) > 0 {
		argv, args = c.Command, nil
	}
	if len(c.Args) > 0 {
		args = c.Args
	}
	if len(argv) == 0 {
		t.Fatal("neither the image nor the chart gives an entrypoint")
	}
	addrs := map[string]string{}
	out := append([]string(nil), argv...)
	for _, a := range args {
		if strings.Contains(a, "$(") {
			t.Fatalf("argument %q refers to a variable; the test does not expand them", a)
		}
		flag, value, _ := strings.Cut(a, "=")
		for _, p := range c.Ports {
			if value == fmt.Sprintf(":%d", p.ContainerPort) || value == fmt.Sprintf("0.0.0.0:%d", p.ContainerPort) {
				addr, err := apiserver.FreeAddr()
				if err != nil {
					t.Fatal(err)
				}
				addrs[p.Name] = addr
				a = flag + "=" + addr
			}
		}
		out = append(out, a)
	}
	for _, name := range []string{"https", "health", "metrics"} {
		if addrs[name] == "" {
			t.Fatalf("no argument binds container port %q: %v", name, args)
		}
	}
	return out, addrs
}

// environment is the process's environment: the image's, the kubelet's
// (HOSTNAME, and KUBERNETES_SERVICE_HOST/PORT, here the test bed's API
// server), then the container's, with the downward API's pod fields.
func environment(t *testing.T, img ociImage, c corev1.Container, podName, ns string) []string {
	t.Helper()
	var order []string
	vars := map[string]string{}
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	for _, kv := range img.config.Config.Env {
		k, v, _ := strings.Cut(kv, "=")
		set(k, v)
	}
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	set("HOSTNAME", podName)
	set("KUBERNETES_SERVICE_HOST", host)
	set("KUBERNETES_SERVICE_PORT", port)
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			if strings.Contains(e.Value, "$(") {
				t.Fatalf("env %s=%q refers to a variable; the test does not expand them", e.Name, e.Value)
			}
			set(e.Name, e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			set(e.Name, podName)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			set(e.Name, ns)
		default:
			t.Fatalf("env %s comes from %+v, which the test does not provide", e.Name, e.ValueFrom)
		}
	}
	environ := make([]string, 0, len(order))
	for _, k := range order {
		environ = append(environ, k+"="+vars[k])
	}
	return environ
}

// checkProcess reads /proc for the running process: its root is the
// unpacked image, and it runs as ids.
func checkProcess(t *testing.T, pid int, rootfs string, ids effectiveIDs) {
	t.Helper()
	if got, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err != nil || got != rootfs {
		t.Errorf("the process's root is %q (%v), want %s", got, err, rootfs)
	}
	status := string(readFile(t, fmt.Sprintf("/proc/%d/status", pid)))
	want := map[string]string{
		"Uid":    strings.Repeat(fmt.Sprintf("\t%d", ids.uid), 4),
		"Gid":    strings.Repeat(fmt.Sprintf("\t%d", ids.gid), 4),
		"CapEff": "\t0000000000000000",
	}
	for _, line := range strings.Split(status, "\n") {
		k, v, _ := strings.Cut(line, ":")
		if w, ok := want[k]; ok && v != w {
			t.Errorf("/proc/%d/status %s:%q, want %q", pid, k, v, w)
		}
	}
}

// metric sums the samples of a counter on the metrics endpoint at addr.
func metric(t *testing.T, addr, token, name string) float64 {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	// The metrics server's certificate is generated at start: the scraper
	// is what is verified, not the server (as the chart's ServiceMonitor).
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET https://%s/metrics = %d %.200s, want 200", addr, resp.StatusCode, body)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

func first[T any](s []T) any {
	if len(s) == 0 {
		return nil
	}
	return s[0]
}
