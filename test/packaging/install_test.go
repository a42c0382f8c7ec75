package packaging

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/watchgate/watchgate/controllers"
)

// TestHelmInstallUpgradeUninstall drives the chart's life cycle through a
// real Helm release on the test API server: the first install (CRD as a
// template, no hook and no custom resource, so no --wait and no retry),
// NOTES.txt, an upgrade that changes a default budget (in the flags the
// leader bootstraps it from) and keeps the generated certificate clients
// already trust, one that turns injection on and so reissues it for the
// webhook's Service, and an uninstall that keeps the CRD and the budgets.
func TestHelmInstallUpgradeUninstall(t *testing.T) {
	installPrerequisites(t)
	for _, want := range []string{
		"STATUS: deployed",
		"https://watchgate.helm-install.svc:443",
		"kubectl get watchbudgets",
		"X-Watchgate-Decision",
		`"watchgate-default" is DryRun`,
	} {
		if !strings.Contains(firstInstall, want) {
			t.Errorf("helm install output lacks %q:\n%s", want, firstInstall)
		}
	}
	if hooks, err := helm(t, "get", "hooks", releaseName, "--namespace", releaseNamespace); err != nil || strings.TrimSpace(hooks) != "" {
		t.Errorf("the release has hooks (%v):\n%s", err, hooks)
	}
	manifest, err := helm(t, "get", "manifest", releaseName, "--namespace", releaseNamespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range decode(t, manifest) {
		if o.GroupVersionKind().Group == "watchgate.io" {
			t.Errorf("the release holds %s %s: Helm would own (and re-create) what watchgate bootstraps", o.GetKind(), o.GetName())
		}
	}
	if got := bootstrapEnforcement(t, "watchgate-default"); got != "DryRun" {
		t.Errorf("watchgate-default enforcement in --bootstrap-budgets = %q, want DryRun", got)
	}

	// The generated serving certificate is signed by the CA in the same
	// Secret, for the Service's DNS names.
	cert := secretKey(t, "tls.crt")
	verifyServingCert(t, cert, secretKey(t, "ca.crt"), "watchgate.helm-install.svc")

	// An upgrade that changes a budget keeps the certificate (looked up,
	// not regenerated) and hands the new spec to the leader in its flags.
	out, err := helm(t, "upgrade", releaseName, chart, "--namespace", releaseNamespace, "--reuse-values", "--set", "defaultBudget.enforcement=Enforce", "--timeout=2m")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"watchgate-default" is Enforce`) {
		t.Errorf("helm upgrade NOTES do not show the new enforcement:\n%s", out)
	}
	if got := secretKey(t, "tls.crt"); got != cert {
		t.Error("helm upgrade replaced the generated certificate; clients trusting the old CA would break")
	}
	if got := bootstrapEnforcement(t, "watchgate-default"); got != "Enforce" {
		t.Errorf("after upgrade, watchgate-default enforcement in --bootstrap-budgets = %q, want Enforce", got)
	}

	// Turning injection on, the documented way, adds the webhook Service's
	// names to what the certificate must carry: the chart issues a new pair
	// that the API server can verify for the webhook, and NOTES says so.
	caBefore := secretKey(t, "ca.crt")
	out, err = helm(t, "upgrade", releaseName, chart, "--namespace", releaseNamespace, "--reuse-values", "--set", "injection.enabled=true", "--timeout=2m")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "the chart issued a new CA and serving certificate") {
		t.Errorf("helm upgrade that turned injection on: NOTES do not say the certificate was reissued:\n%s", out)
	}
	reissued, ca := secretKey(t, "tls.crt"), secretKey(t, "ca.crt")
	if reissued == cert || ca == caBefore {
		t.Error("turning injection on kept the certificate, which does not name the webhook's Service")
	}
	verifyServingCert(t, reissued, ca, "watchgate-webhook.helm-install.svc")
	verifyServingCert(t, reissued, ca, "watchgate.helm-install.svc")
	if bundle := kubectlOK(t, "get", "mutatingwebhookconfiguration", "-l", "app.kubernetes.io/instance="+releaseName, "-o", "jsonpath={.items[0].webhooks[0].clientConfig.caBundle}"); bundle != base64.StdEncoding.EncodeToString([]byte(ca)) {
		t.Error("the webhook's caBundle is not the reissued CA")
	}
	// The next upgrade, with the same names, keeps it.
	out, err = helm(t, "upgrade", releaseName, chart, "--namespace", releaseNamespace, "--reuse-values", "--timeout=2m")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "the chart issued a new CA") || secretKey(t, "tls.crt") != reissued {
		t.Error("an upgrade with unchanged names reissued the certificate")
	}

	// Uninstall removes the workload but keeps the CRD, and with it every
	// WatchBudget.
	kept := fmt.Sprintf("install-kept-%d", time.Now().UnixNano())
	kubectlIn(t, "apiVersion: watchgate.io/v1alpha1\nkind: WatchBudget\nmetadata:\n  name: "+kept+"\nspec:\n  subjects: [{kind: User, name: "+kept+"}]\n", "apply", "-f", "-")
	t.Cleanup(func() { _, _ = kubectl(t, "", "delete", "wb", kept, "--ignore-not-found") })
	if _, err := helm(t, "uninstall", releaseName, "--namespace", releaseNamespace, "--wait", "--timeout=2m"); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl(t, "", "get", "deployment", "watchgate", "-n", releaseNamespace); err == nil {
		t.Errorf("the Deployment survived helm uninstall: %s", out)
	}
	kubectlOK(t, "get", "crd", "watchbudgets.watchgate.io")
	kubectlOK(t, "get", "wb", kept)

	// Installing again, without --wait, adopts the kept CRD (a later test
	// binary run, or an operator reinstalling).
	if _, err := helm(t, "install", releaseName, chart, "--namespace", releaseNamespace, "--timeout=2m"); err != nil {
		t.Fatalf("reinstall over the kept CRD: %v", err)
	}
	if got := bootstrapEnforcement(t, "watchgate-default"); got != "DryRun" {
		t.Errorf("after reinstall, watchgate-default enforcement in --bootstrap-budgets = %q, want DryRun", got)
	}
}

// TestHelmTemplateAppliesInOneRun applies `helm template`'s output for
// real with one server-side apply, as Argo CD does after the CRD and
// `helm template | kubectl apply -f -` does with it: the output holds no
// custom resource, whose kind a first apply could not map. (The CRD is the
// test bed's, shared with the other tests, so it is checked, not applied.)
func TestHelmTemplateAppliesInOneRun(t *testing.T) {
	installPrerequisites(t)
	const ns = "template-apply"
	createNamespace(t, ns)
	var objs []string
	for _, o := range decode(t, render(t, "tmpl", ns)) {
		switch {
		case o.GroupVersionKind().Group == "watchgate.io":
			t.Errorf("the chart renders %s %s: a first apply cannot map it", o.GetKind(), o.GetName())
		case o.GetKind() == "CustomResourceDefinition":
		default:
			objs = append(objs, toYAML(t, o))
		}
	}
	manifests := strings.Join(objs, "\n---\n")
	if out, err := kubectl(t, manifests, "apply", "--server-side", "--field-manager=argocd-controller", "-f", "-"); err != nil {
		t.Fatalf("one apply of everything: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = kubectl(t, manifests, "delete", "--ignore-not-found", "--wait=false", "-f", "-") })
	if got := kubectlOK(t, "get", "deployment", "tmpl-watchgate", "-n", ns, "-o", "jsonpath={.spec.replicas}"); got != "2" {
		t.Errorf("the applied Deployment has %q replicas, want 2", got)
	}
}

// bootstrapEnforcement is the enforcement of budget name in the installed
// release's --bootstrap-budgets.
func bootstrapEnforcement(t *testing.T, name string) string {
	t.Helper()
	manifest, err := helm(t, "get", "manifest", releaseName, "--namespace", releaseNamespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range stringSlice(container(t, find(t, decode(t, manifest), "Deployment", "watchgate")), "args") {
		v, ok := strings.CutPrefix(a, "--bootstrap-budgets=")
		if !ok {
			continue
		}
		budgets, err := controllers.ParseBootstrapBudgets(v)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range budgets {
			if b.Name == name {
				e, _ := b.Spec["enforcement"].(string)
				return e
			}
		}
	}
	t.Fatalf("no budget %s in the release's --bootstrap-budgets", name)
	return ""
}

func kubectlOK(t *testing.T, args ...string) string {
	t.Helper()
	out, err := kubectl(t, "", args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// secretKey returns a key of the release's TLS Secret, PEM-decoded from
// base64.
func secretKey(t *testing.T, key string) string {
	t.Helper()
	b64 := kubectlOK(t, "get", "secret", "watchgate-tls", "-n", releaseNamespace, "-o", "jsonpath={.data."+strings.ReplaceAll(key, ".", `\.`)+"}")
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("secret key %s: %v", key, err)
	}
	return string(b)
}

// verifyServingCert checks that certPEM chains to caPEM and is valid for
// server authentication as dnsName.
func verifyServingCert(t *testing.T, certPEM, caPEM, dnsName string) {
	t.Helper()
	block, _ := pem.Decode([]byte(certPEM))
	if block == nil {
		t.Fatalf("tls.crt is not PEM:\n%s", certPEM)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(caPEM)) {
		t.Fatalf("ca.crt is not PEM:\n%s", caPEM)
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: dnsName, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("serving certificate does not verify for %s: %v", dnsName, err)
	}
}

// TestGeneratedCertificateCoversTheServiceAndExtraNames renders the chart's
// own certificate with extra names and checks it verifies, against the CA
// in the same Secret, for each name clients may use.
func TestGeneratedCertificateCoversTheServiceAndExtraNames(t *testing.T) {
	objs := decode(t, render(t, "wg", "proxy-ns", "--set", "tls.extraDNSNames={watchgate.example.com}", "--set", "tls.ipAddresses={10.1.2.3}"))
	secret := find(t, objs, "Secret", "wg-watchgate-tls")
	data, _, _ := unstructured.NestedStringMap(secret.Object, "data")
	decoded := map[string]string{}
	for k, v := range data {
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		decoded[k] = string(b)
	}
	for _, name := range []string{"wg-watchgate", "wg-watchgate.proxy-ns.svc", "wg-watchgate.proxy-ns.svc.cluster.local", "watchgate.example.com", "10.1.2.3"} {
		verifyServingCert(t, decoded["tls.crt"], decoded["ca.crt"], name)
	}
	if !strings.Contains(decoded["tls.key"], "PRIVATE KEY") {
		t.Error("tls.key is not a PEM private key")
	}
}
