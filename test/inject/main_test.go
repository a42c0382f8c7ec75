package inject

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/watchgate/watchgate/inject"
	"github.com/watchgate/watchgate/proxy"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

var env *apiserver.Env

// ownNamespace plays watchgate's namespace: never routed.
const ownNamespace = "watchgate-system"

func TestMain(m *testing.M) {
	apiserver.Main(m, &env, apiserver.Suite{Options: apiserver.Options{
		Args: map[string]string{
			// As in a real cluster: pods get their kube-api-access volume
			// before mutating webhooks see them.
			"enable-admission-plugins":  "ServiceAccount,MutatingAdmissionWebhook",
			"disable-admission-plugins": "",
		},
		Webhooks: envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(apiserver.RepoRoot(), "config", "webhook", "manifests.yaml")},
		},
	}})
}

// pki is a CA and a serving pair it signed for 127.0.0.1 and localhost.
type pki struct {
	caPEM, certPEM, keyPEM []byte
}

func newPKI(t testing.TB) pki {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "watchgate-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano() + 1), Subject: pkix.Name{CommonName: "watchgate"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return pki{
		caPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
}

// testProxy is a watchgate proxy in front of the test bed, serving a
// certificate signed by CA; its tls folder is laid out like the chart's
// Secret (tls.crt, tls.key, ca.crt).
type testProxy struct {
	*proxy.Server
	Engine *ratelimit.Engine
	Dir    string
	Target inject.Target
	CA     []byte
}

func startProxy(t testing.TB, budgets ...ratelimit.Budget) *testProxy {
	t.Helper()
	p := newPKI(t)
	dir := t.TempDir()
	for name, b := range map[string][]byte{"tls.crt": p.certPEM, "tls.key": p.keyPEM, "ca.crt": p.caPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	engine := ratelimit.NewEngine(ratelimit.Options{Seed: 1})
	policy, err := ratelimit.NewPolicy(budgets)
	if err != nil {
		t.Fatal(err)
	}
	engine.SetPolicy(time.Now(), policy)
	srv, err := proxy.NewServer(proxy.Options{
		BindAddress: "127.0.0.1:0", CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
		Upstream: env.Config, Engine: engine, Logger: logr.Discard(),
		ShutdownDrainDelay: time.Millisecond, ShutdownGracePeriod: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("proxy stopped with: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("proxy did not stop within 30s")
		}
	})
	eventually(t, 30*time.Second, "proxy ready", func() (bool, error) { return srv.ReadyCheck(nil) == nil, srv.ReadyCheck(nil) })
	_, port, _ := net.SplitHostPort(srv.Addr().String())
	n, _ := strconv.Atoi(port)
	return &testProxy{Server: srv, Engine: engine, Dir: dir, CA: p.caPEM, Target: inject.Target{Host: "127.0.0.1", Port: int32(n)}}
}

// startInjector runs the webhook and the CA publisher in a manager of
// their own, on the address the API server calls, until the test ends.
func startInjector(t testing.TB, target inject.Target, caFile string, edits ...func(*inject.Options)) *inject.Pieces {
	t.Helper()
	return startInjectorAs(t, env.Config, target, caFile, edits...)
}

// startInjectorAs is startInjector with the API server credentials of cfg.
func startInjectorAs(t testing.TB, cfg *rest.Config, target inject.Target, caFile string, edits ...func(*inject.Options)) *inject.Pieces {
	t.Helper()
	wh := env.Webhooks
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 clientgoscheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Logger:                 logr.Discard(),
	})
	if err != nil {
		t.Fatal(err)
	}
	server := webhook.NewServer(webhook.Options{Host: wh.LocalServingHost, Port: wh.LocalServingPort, CertDir: wh.LocalServingCertDir})
	opts := inject.Options{
		Target:             target,
		ExcludedNamespaces: []string{"kube-system", ownNamespace},
		CA:                 &inject.CASource{File: caFile, Interval: 100 * time.Millisecond},
		WebhookServer:      server,
	}
	for _, edit := range edits {
		edit(&opts)
	}
	pieces, err := inject.SetupWithManager(mgr, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("manager: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("manager did not stop within 30s")
		}
	})
	if opts.WebhookServer == nil {
		return pieces
	}
	addr := net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort))
	eventually(t, 30*time.Second, "webhook serving", func() (bool, error) {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a liveness probe only
		if err != nil {
			return false, err
		}
		return true, c.Close()
	})
	return pieces
}

// namespace creates a namespace with labels and the service account the
// pods run as (there is no controller-manager to create "default").
func namespace(t testing.TB, name string, labels map[string]string, sa string) {
	t.Helper()
	ctx := context.Background()
	cs := env.Clientset
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		if _, err := cs.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	acct := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: sa}}
	if _, err := cs.CoreV1().ServiceAccounts(name).Create(ctx, acct, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func uniqueName(prefix string) string { return prefix + "-" + utilrand.String(5) }

func generous(name string, subjects ...ratelimit.Subject) ratelimit.Budget {
	return ratelimit.Budget{
		Name: name, Precedence: 100, Enforcement: ratelimit.Enforce, Subjects: subjects,
		Limits: ratelimit.Limits{WatchOpensPerMinute: 60000, WatchBurst: 10000, MaxConcurrentWatches: 10000},
	}
}
