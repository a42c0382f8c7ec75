package main

import (
	"bytes"
	"encoding/pem"
	"runtime/debug"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// caBundleModule is the module the CA bundle comes from; its version (this
// program's build information) names the bundle in the SBOM.
const caBundleModule = "golang.org/x/crypto/x509roots/fallback"

// caBundle returns the PEM bundle of the roots Mozilla's NSS trusts, as
// golang.org/x/crypto/x509roots/fallback ships them: the same set on every
// machine for one version of the module, fetched through the Go module
// proxy like any other dependency. Roots that carry a constraint (a
// "distrust after" date) are left out: a PEM file cannot express it, and a
// reader would trust them without it.
func caBundle() []byte {
	var b bytes.Buffer
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		// Encoding to a bytes.Buffer does not fail.
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate})
	}
	return b.Bytes()
}

// caBundleVersion is the version of caBundleModule this program was built
// with, or "" when unknown.
func caBundleVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, m := range info.Deps {
		if m.Path == caBundleModule {
			if m.Replace != nil {
				return m.Replace.Version
			}
			return m.Version
		}
	}
	return ""
}
