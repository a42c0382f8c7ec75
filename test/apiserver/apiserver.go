package apiserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// KubeVersion is the version of kube-apiserver, etcd's client and kubectl the
// test bed is built from (hack/testbin.sh).
const KubeVersion = "v1.37.2"

// Options configure one control plane.
type Options struct {
	// StaleVersions starts kube-apiserver without a watch cache and with etcd
	// compacted every 5 seconds, so that a resourceVersion goes stale ("too
	// old", 410 Expired) within seconds instead of minutes.
	StaleVersions bool
	// CRDDirectoryPaths are loaded before Start returns; a missing path is an
	// error.
	CRDDirectoryPaths []string
	// Args are extra kube-apiserver flags, name without dashes → value.
	Args map[string]string
	// Webhooks are admission webhook configurations to install; envtest
	// points them at a local serving address and certificate (see
	// Env.Webhooks) so that kube-apiserver calls a webhook server in the
	// test process.
	Webhooks envtest.WebhookInstallOptions
	// Restartable keeps kube-apiserver's certificates and service-account
	// keys in a directory of its own, so that StopAPIServer and
	// StartAPIServer restart it on the same port with the same etcd, CA and
	// tokens (restart.go).
	Restartable bool
}

// Env is a running control plane.
type Env struct {
	// Config is an admin (system:masters) client config.
	Config *rest.Config
	// Clientset is a typed admin client.
	Clientset kubernetes.Interface
	// AssetsDir holds kube-apiserver, etcd and kubectl.
	AssetsDir string
	// Kubeconfig is the path of an admin kubeconfig file (for kubectl and
	// for watchgate's --kubeconfig); it is removed by Stop.
	Kubeconfig string
	// Webhooks is where the installed webhooks are served from
	// (LocalServingHost, LocalServingPort, LocalServingCertDir).
	Webhooks *envtest.WebhookInstallOptions

	env *envtest.Environment
	// certDir is the Restartable certificate directory, removed by Stop.
	certDir string
}

// AssetsDir returns the folder that holds the test bed's binaries:
// $KUBEBUILDER_ASSETS when set, else the version-keyed cache hack/testbin.sh
// builds into. It fails with instructions when the binaries are missing.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		cache := os.Getenv("WATCHGATE_TESTBIN_DIR")
		if cache == "" {
			base := os.Getenv("XDG_CACHE_HOME")
			if base == "" {
				home, err := os.UserHomeDir()
				if err != nil {
					return "", err
				}
				base = filepath.Join(home, ".cache")
			}
			cache = filepath.Join(base, "watchgate", "testbin")
		}
		dir = filepath.Join(cache, KubeVersion)
	}
	for _, bin := range []string{"kube-apiserver", "etcd", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("test bed binary %s missing in %s: run `make testbin` (or set KUBEBUILDER_ASSETS)", bin, dir)
		}
	}
	return dir, nil
}

// Start starts etcd and kube-apiserver and waits until they serve.
func Start(opts Options) (*Env, error) {
	dir, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory:    dir,
		CRDDirectoryPaths:        opts.CRDDirectoryPaths,
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
		WebhookInstallOptions:    opts.Webhooks,
	}
	api := te.ControlPlane.GetAPIServer()
	args := api.Configure()
	if opts.StaleVersions {
		args.Set("watch-cache", "false")
		args.Set("etcd-compaction-interval", "5s")
	}
	for k, v := range opts.Args {
		args.Set(k, v)
	}
	certDir, err := restartable(opts, te)
	if err != nil {
		return nil, err
	}
	cfg, err := te.Start()
	if err != nil {
		removeCertDir(certDir)
		return nil, fmt.Errorf("start test control plane from %s: %w", dir, err)
	}
	// Tests make many requests; the default client-side limiter would
	// measure itself instead of the server.
	cfg.QPS, cfg.Burst = -1, -1
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		_ = te.Stop()
		return nil, err
	}
	admin, err := te.AddUser(envtest.User{Name: "watchgate-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		_ = te.Stop()
		return nil, err
	}
	k, err := admin.Kubectl()
	if err != nil {
		_ = te.Stop()
		return nil, err
	}
	kubeconfig := ""
	for _, o := range k.Opts {
		if v, ok := strings.CutPrefix(o, "--kubeconfig="); ok {
			kubeconfig = v
		}
	}
	return &Env{Config: cfg, Clientset: cs, AssetsDir: dir, Kubeconfig: kubeconfig, Webhooks: &te.WebhookInstallOptions, env: te, certDir: certDir}, nil
}

// Stop stops kube-apiserver and etcd and removes their data.
func (e *Env) Stop() error {
	if e == nil || e.env == nil {
		return nil
	}
	defer removeCertDir(e.certDir)
	return e.env.Stop()
}

// Suite is what a test package's TestMain asks of the test bed besides
// its control plane.
type Suite struct {
	// Options configure the control plane.
	Options
	// Helm, when not nil, receives the path of the helm pinned in
	// hack/tools/go.mod, built once into a temporary folder that is removed
	// after the tests (BuildHelm).
	Helm *string
	// Setup, when not nil, runs once the control plane serves and before the
	// tests (to build clients from it); an error stops the control plane
	// and fails the run.
	Setup func(*Env) error
}

// Main is the TestMain of every package whose tests share one control
// plane: it sets controller-runtime's logger (Logger), builds helm when
// asked, starts the control plane into *env, runs Setup and the tests,
// stops the control plane and exits with the tests' code. When the test bed
// is missing it fails (it does not skip): run `make testbin`.
func Main(m *testing.M, env **Env, s Suite) {
	os.Exit(run(m, env, s))
}

func run(m *testing.M, env **Env, s Suite) int {
	// envtest, the managers and the proxy's informers log through
	// controller-runtime, which prints a stack trace when no logger was
	// ever set.
	ctrllog.SetLogger(Logger())
	if s.Helm != nil {
		tmp, err := os.MkdirTemp("", "watchgate-helm-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "test bed:", err)
			return 1
		}
		defer os.RemoveAll(tmp)
		if *s.Helm, err = BuildHelm(tmp); err != nil {
			fmt.Fprintln(os.Stderr, "test bed:", err)
			return 1
		}
	}
	e, err := Start(s.Options)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test bed:", err)
		return 1
	}
	defer func() {
		if err := e.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop test bed:", err)
		}
	}()
	*env = e
	if s.Setup != nil {
		if err := s.Setup(e); err != nil {
			fmt.Fprintln(os.Stderr, "test bed setup:", err)
			return 1
		}
	}
	return m.Run()
}

// Logger is the logger of the code under test: silent, or with
// WATCHGATE_TEST_LOG set, everything up to V(5) on stderr.
func Logger() logr.Logger {
	if os.Getenv("WATCHGATE_TEST_LOG") == "" {
		return logr.Discard()
	}
	return zap.New(zap.UseDevMode(true), zap.Level(zapcore.Level(-5)))
}

// Kubectl runs the test bed's kubectl against the API server as the admin
// and returns its combined output.
func (e *Env) Kubectl(ctx context.Context, args ...string) (string, error) {
	return e.KubectlAs(ctx, e.Kubeconfig, args...)
}

// KubectlAs runs the test bed's kubectl with the given kubeconfig file.
func (e *Env) KubectlAs(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(e.AssetsDir, "kubectl"), append([]string{"--kubeconfig=" + kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), fmt.Errorf("kubectl %v: %w: %s", args, err, out)
		}
		return string(out), err
	}
	return string(out), nil
}

// RepoRoot returns the root of the watchgate module, for tests that load
// files such as config/crd/bases.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}
