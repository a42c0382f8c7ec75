package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The SPDX 2.3 document (https://spdx.github.io/spdx-spec/v2.3/), as much
// of it as an image of one Go binary needs.
type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	SPDXID                string            `json:"SPDXID"`
	Name                  string            `json:"name"`
	VersionInfo           string            `json:"versionInfo,omitempty"`
	PrimaryPackagePurpose string            `json:"primaryPackagePurpose,omitempty"`
	DownloadLocation      string            `json:"downloadLocation"`
	FilesAnalyzed         bool              `json:"filesAnalyzed"`
	Checksums             []spdxChecksum    `json:"checksums,omitempty"`
	LicenseConcluded      string            `json:"licenseConcluded"`
	LicenseDeclared       string            `json:"licenseDeclared"`
	CopyrightText         string            `json:"copyrightText"`
	Comment               string            `json:"comment,omitempty"`
	ExternalRefs          []spdxExternalRef `json:"externalRefs,omitempty"`
}

type spdxChecksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type spdxExternalRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	SPDXElementID      string `json:"spdxElementId"`
	RelationshipType   string `json:"relationshipType"`
	RelatedSPDXElement string `json:"relatedSpdxElement"`
}

const noAssertion = "NOASSERTION"

// sbomInput is what the SBOM of one platform's image says.
type sbomInput struct {
	repository, version string
	platform            v1.Platform
	// manifest is the digest of the platform's image manifest.
	manifest v1.Hash
	// binary is the path of the binary the image holds.
	binary  string
	created time.Time
}

// newSBOM describes one platform's image: the image (by manifest digest),
// the binary in it (by SHA-256), the Go toolchain and every module
// compiled in, read from the binary's build information (what `go version
// -m` prints), and the CA bundle. The document's namespace is the
// manifest digest, so the same image always gets the same document.
func newSBOM(in sbomInput) (*spdxDocument, error) {
	info, err := buildinfo.ReadFile(in.binary)
	if err != nil {
		return nil, fmt.Errorf("read the build information of %s: %w", in.binary, err)
	}
	bin, err := os.ReadFile(in.binary)
	if err != nil {
		return nil, err
	}
	binSum := sha256.Sum256(bin)
	arch := in.platform.Architecture
	imageName := in.repository[strings.LastIndex(in.repository, "/")+1:]
	ref := in.repository + ":" + tagFor(in.version)

	doc := &spdxDocument{
		SPDXVersion:       "SPDX-2.3",
		DataLicense:       "CC0-1.0",
		SPDXID:            "SPDXRef-DOCUMENT",
		Name:              ref + " " + platformString(in.platform),
		DocumentNamespace: "https://github.com/watchgate/watchgate/spdx/" + in.manifest.Hex,
		CreationInfo: spdxCreationInfo{
			Created:  in.created.UTC().Format(time.RFC3339),
			Creators: []string{"Organization: watchgate", "Tool: watchgate-hack-image"},
		},
	}
	add := func(p spdxPackage, rel string, from string) {
		p.DownloadLocation = orNoAssertion(p.DownloadLocation)
		p.LicenseConcluded = orNoAssertion(p.LicenseConcluded)
		p.LicenseDeclared = orNoAssertion(p.LicenseDeclared)
		p.CopyrightText = orNoAssertion(p.CopyrightText)
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, spdxRelationship{SPDXElementID: from, RelationshipType: rel, RelatedSPDXElement: p.SPDXID})
	}

	add(spdxPackage{
		SPDXID:                "SPDXRef-Image",
		Name:                  imageName,
		VersionInfo:           in.version,
		PrimaryPackagePurpose: "CONTAINER",
		Checksums:             []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: in.manifest.Hex}},
		LicenseDeclared:       "Apache-2.0",
		ExternalRefs: []spdxExternalRef{purl(fmt.Sprintf("pkg:oci/%s@%s?arch=%s&repository_url=%s",
			imageName, url.QueryEscape(in.manifest.String()), arch, url.QueryEscape(in.repository)))},
	}, "DESCRIBES", "SPDXRef-DOCUMENT")

	// The main module: with -buildvcs=false its build information says
	// "(devel)"; the version stamped into the binary is the image's.
	add(spdxPackage{
		SPDXID:                "SPDXRef-Binary",
		Name:                  info.Main.Path,
		VersionInfo:           in.version,
		PrimaryPackagePurpose: "APPLICATION",
		DownloadLocation:      "git+https://github.com/watchgate/watchgate",
		Checksums:             []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: hex.EncodeToString(binSum[:])}},
		LicenseDeclared:       "Apache-2.0",
		Comment:               "the binary " + binaryPath + ", built by " + info.GoVersion + " with " + buildSettings(info),
		ExternalRefs:          []spdxExternalRef{purl("pkg:golang/" + info.Main.Path + "@" + in.version + "?type=module")},
	}, "CONTAINS", "SPDXRef-Image")

	add(spdxPackage{
		SPDXID:                "SPDXRef-CABundle",
		Name:                  caBundleModule,
		VersionInfo:           caBundleVersion(),
		PrimaryPackagePurpose: "FILE",
		Comment:               caBundlePath + ": the roots of Mozilla's NSS without a distrust-after constraint, as this module ships them",
		ExternalRefs:          []spdxExternalRef{purl("pkg:golang/" + caBundleModule + "@" + caBundleVersion())},
	}, "CONTAINS", "SPDXRef-Image")

	goVersion := strings.TrimPrefix(info.GoVersion, "go")
	add(spdxPackage{
		SPDXID:                "SPDXRef-Go-stdlib",
		Name:                  "stdlib",
		VersionInfo:           info.GoVersion,
		PrimaryPackagePurpose: "LIBRARY",
		DownloadLocation:      "https://go.dev/dl/",
		LicenseDeclared:       "BSD-3-Clause",
		ExternalRefs:          []spdxExternalRef{purl("pkg:golang/stdlib@" + goVersion)},
	}, "DEPENDS_ON", "SPDXRef-Binary")

	seen := map[string]bool{}
	for _, dep := range info.Deps {
		path, version, sum, download := dep.Path, dep.Version, dep.Sum, proxyURL(dep.Path, dep.Version)
		var notes []string
		switch r := dep.Replace; {
		case r == nil:
		case r.Version == "" || r.Version == "(devel)":
			notes = append(notes, "replaced by the folder "+r.Path)
			sum, download = "", noAssertion
		default:
			notes = append(notes, "replaces "+dep.Path+" "+dep.Version)
			path, version, sum, download = r.Path, r.Version, r.Sum, proxyURL(r.Path, r.Version)
		}
		if sum != "" {
			notes = append(notes, "go.sum "+sum)
		}
		id := "SPDXRef-Go-" + spdxIDChars.ReplaceAllString(path+"-"+version, "-")
		if seen[id] {
			return nil, fmt.Errorf("two modules map to SPDX id %s", id)
		}
		seen[id] = true
		add(spdxPackage{
			SPDXID:                id,
			Name:                  path,
			VersionInfo:           version,
			PrimaryPackagePurpose: "LIBRARY",
			DownloadLocation:      download,
			Comment:               strings.Join(notes, "; "),
			ExternalRefs:          []spdxExternalRef{purl("pkg:golang/" + path + "@" + version)},
		}, "DEPENDS_ON", "SPDXRef-Binary")
	}
	return doc, nil
}

// spdxIDChars are the characters an SPDX id may not hold.
var spdxIDChars = regexp.MustCompile(`[^A-Za-z0-9.-]`)

func purl(locator string) spdxExternalRef {
	return spdxExternalRef{ReferenceCategory: "PACKAGE-MANAGER", ReferenceType: "purl", ReferenceLocator: locator}
}

func orNoAssertion(s string) string {
	if s == "" {
		return noAssertion
	}
	return s
}

// proxyURL is where the Go module proxy serves a module version's zip.
func proxyURL(path, version string) string {
	return "https://proxy.golang.org/" + escapeModulePath(path) + "/@v/" + version + ".zip"
}

// escapeModulePath is the module proxy's case encoding: an upper-case
// letter becomes '!' and its lower case.
func escapeModulePath(path string) string {
	var b strings.Builder
	for _, r := range path {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// buildSettings lists the build settings that shaped the binary (flags,
// target, cgo), as `go version -m` prints them.
func buildSettings(info *buildinfo.BuildInfo) string {
	var s []string
	for _, kv := range info.Settings {
		s = append(s, kv.Key+"="+kv.Value)
	}
	return strings.Join(s, " ")
}
