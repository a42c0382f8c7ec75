package packaging

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestHelmInstallUpgradeUninstall drives the chart's life cycle through a
// real Helm release on the test API server: the first install (CRD as a
// template, WatchBudgets from the post-install hook once the CRD exists),
// NOTES.txt, an upgrade that keeps the generated certificate clients
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

	// The budgets the hook created: the catch-all rejects nothing.
	if got := kubectlOK(t, "get", "wb", "watchgate-default", "-o", "jsonpath={.spec.enforcement}"); got != "DryRun" {
		t.Errorf("watchgate-default enforcement = %q, want DryRun", got)
	}
	if got := kubectlOK(t, "get", "wb", "watchgate-exempt", "-o", "jsonpath={.spec.enforcement}/{.spec.subjects[0].name}"); got != "Exempt/system:masters" {
		t.Errorf("watchgate-exempt = %q, want Exempt/system:masters", got)
	}

	// The generated serving certificate is signed by the CA in the same
	// Secret, for the Service's DNS names.
	cert := secretKey(t, "tls.crt")
	verifyServingCert(t, cert, secretKey(t, "ca.crt"), "watchgate.helm-install.svc")

	// An upgrade that changes a budget keeps the certificate (looked up,
	// not regenerated) and re-creates the budget from the values.
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
	if got := kubectlOK(t, "get", "wb", "watchgate-default", "-o", "jsonpath={.spec.enforcement}"); got != "Enforce" {
		t.Errorf("after upgrade, watchgate-default enforcement = %q, want Enforce", got)
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
	if _, err := helm(t, "uninstall", releaseName, "--namespace", releaseNamespace, "--wait", "--timeout=2m"); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl(t, "", "get", "deployment", "watchgate", "-n", releaseNamespace); err == nil {
		t.Errorf("the Deployment survived helm uninstall: %s", out)
	}
	kubectlOK(t, "get", "crd", "watchbudgets.watchgate.io")
	kubectlOK(t, "get", "wb", "watchgate-default")

	// Installing again adopts the kept CRD (a later test binary run, or an
	// operator reinstalling).
	if _, err := helmInstall(t, "install", releaseName, chart, "--namespace", releaseNamespace, "--timeout=2m"); err != nil {
		t.Fatalf("reinstall over the kept CRD: %v", err)
	}
	if got := kubectlOK(t, "get", "wb", "watchgate-default", "-o", "jsonpath={.spec.enforcement}"); got != "DryRun" {
		t.Errorf("after reinstall, watchgate-default enforcement = %q, want DryRun", got)
	}
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
