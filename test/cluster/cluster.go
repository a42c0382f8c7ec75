package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/watchgate/watchgate/test/apiserver"
)

// Cluster is a running one-node cluster started by hack/cluster.sh.
type Cluster struct {
	// Dir is the run folder: every file the cluster writes, its logs in
	// Dir/logs.
	Dir string
	// Kubeconfig is the path of the admin's (system:masters) kubeconfig.
	Kubeconfig string
	// Config is the admin's rest.Config, Clientset its clientset.
	Config    *rest.Config
	Clientset kubernetes.Interface
	// BinDir holds the node's binaries and imagetar (hack/cluster.sh's
	// output); TestbinDir kubectl, kube-apiserver and etcd.
	BinDir, TestbinDir string
	// StartTime is how long `hack/cluster.sh up` took.
	StartTime time.Duration
}

// Options configure the cluster Start starts.
type Options struct {
	// StaleVersions starts kube-apiserver as the test bed's
	// apiserver.Options.StaleVersions does (hack/cluster.sh up
	// --stale-versions): without a watch cache and with etcd compacted
	// every 5 s, so that a resourceVersion goes "too old" within seconds
	// of churn (StaleVersions) instead of minutes.
	StaleVersions bool
}

// SkipReason says why a node cannot run here, or "" when it can.
func SkipReason() string {
	if runtime.GOOS != "linux" {
		return "the cluster tests need Linux (a kubelet with containerd and runc); this is " + runtime.GOOS
	}
	if os.Geteuid() != 0 {
		return "the cluster tests need root (containers, a bridge, iptables rules); run `sudo make test` or CI"
	}
	return ""
}

func script() string { return filepath.Join(apiserver.RepoRoot(), "hack", "cluster.sh") }

// Build builds (once, cached by version) the node's binaries and returns
// their folder and the test bed's.
func Build(ctx context.Context) (binDir, testbinDir string, err error) {
	out, err := command(ctx, script())
	if err != nil {
		return "", "", err
	}
	binDir = strings.TrimSpace(out)
	out, err = command(ctx, filepath.Join(apiserver.RepoRoot(), "hack", "testbin.sh"))
	return binDir, strings.TrimSpace(out), err
}

// Start builds what is missing and starts a cluster in dir, which must be
// new or empty. Stop it with Stop, even when Start fails (Start stops
// what it started itself, Stop then finds nothing left).
func Start(ctx context.Context, dir string, opts Options) (*Cluster, error) {
	if r := SkipReason(); r != "" {
		return nil, errors.New(r)
	}
	binDir, testbinDir, err := Build(ctx)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Kubeconfig: filepath.Join(dir, "kubeconfig"), BinDir: binDir, TestbinDir: testbinDir}
	start := time.Now()
	args := []string{"up"}
	if opts.StaleVersions {
		args = append(args, "--stale-versions")
	}
	cmd := exec.CommandContext(ctx, script(), append(args, dir)...)
	// The test binary owns the cluster: if it dies without Stop, the next
	// `up` finds the cluster stale and stops it.
	cmd.Env = append(os.Environ(), "WATCHGATE_CLUSTER_OWNER="+strconv.Itoa(os.Getpid()))
	if out, err := cmd.CombinedOutput(); err != nil {
		return c, fmt.Errorf("hack/cluster.sh up %s: %w\n%s", dir, err, out)
	}
	c.StartTime = time.Since(start)
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return c, err
	}
	c.Config.QPS, c.Config.Burst = 200, 400
	if c.Clientset, err = kubernetes.NewForConfig(c.Config); err != nil {
		return c, err
	}
	return c, nil
}

// Stop stops the cluster and undoes its changes to the host; the run
// folder keeps the logs.
func (c *Cluster) Stop(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	_, err := command(ctx, script(), "down", c.Dir)
	return time.Since(start), err
}

// Kubectl runs the test bed's kubectl as the admin and returns its stdout.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.KubectlAs(ctx, c.Kubeconfig, args...)
}

// KubectlAs runs kubectl with kubeconfig and returns its stdout.
func (c *Cluster) KubectlAs(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	return command(ctx, filepath.Join(c.TestbinDir, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
}

// Import imports the image tarball (a `docker save` or OCI archive) into
// the node's containerd, where pods with imagePullPolicy IfNotPresent or
// Never find it.
func (c *Cluster) Import(ctx context.Context, tarball string) error {
	_, err := command(ctx, "ctr", "-a", filepath.Join(c.Dir, "containerd.sock"), "-n", "k8s.io", "images", "import", tarball)
	return err
}

// command runs name with args and returns its stdout; the error carries
// its stderr.
func command(ctx context.Context, name string, args ...string) (string, error) {
	cmd := execCommand(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Main is TestMain's body for a package of cluster tests: it starts one
// cluster for the package into *c with opts, runs setup on it (nil: nothing), then
// the tests, and stops it. Where a
// node cannot run (SkipReason) it says so loudly and runs the tests with
// *c nil; they skip through Need. A cluster that should start and does
// not fails the package.
func Main(m *testing.M, c **Cluster, opts Options, setup func(*Cluster) error) int {
	if r := SkipReason(); r != "" {
		fmt.Fprintf(os.Stderr, "\n!!! SKIPPING the cluster tests: %s\n\n", r)
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "watchgate-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cl, err := Start(ctx, dir, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "start the cluster: %v\n", err)
		if cl != nil {
			_, _ = cl.Stop(context.Background())
		}
		fmt.Fprintf(os.Stderr, "its logs: %s/logs\n", dir)
		return 1
	}
	fmt.Fprintf(os.Stderr, "cluster up in %.1fs (%s)\n", cl.StartTime.Seconds(), dir)
	*c = cl
	code := 0
	if setup != nil {
		if err := setup(cl); err != nil {
			fmt.Fprintf(os.Stderr, "set the cluster up: %v\n", err)
			code = 1
		}
	}
	if code == 0 {
		code = m.Run()
	}
	took, err := cl.Stop(context.Background())
	if err != nil {
		fmt.Fprintf(os.Stderr, "stop the cluster: %v\n", err)
		code = 1
	}
	fmt.Fprintf(os.Stderr, "cluster down in %.1fs\n", took.Seconds())
	if code == 0 {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "the cluster's logs: %s/logs\n", dir)
	}
	return code
}

// Need skips t, with the reason, when c is nil because no node can run
// here.
func Need(t testing.TB, c *Cluster) {
	t.Helper()
	if c == nil {
		t.Skipf("SKIPPED, no cluster: %s", SkipReason())
	}
}

func execCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}
