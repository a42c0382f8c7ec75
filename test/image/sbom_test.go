package image

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The parts of an SPDX 2.3 document the test reads.
type spdxDocument struct {
	SPDXVersion       string `json:"spdxVersion"`
	DocumentNamespace string `json:"documentNamespace"`
	Packages          []struct {
		SPDXID      string `json:"SPDXID"`
		Name        string `json:"name"`
		VersionInfo string `json:"versionInfo"`
		Checksums   []struct {
			Algorithm     string `json:"algorithm"`
			ChecksumValue string `json:"checksumValue"`
		} `json:"checksums"`
	} `json:"packages"`
	Relationships []struct {
		SPDXElementID      string `json:"spdxElementId"`
		RelationshipType   string `json:"relationshipType"`
		RelatedSPDXElement string `json:"relatedSpdxElement"`
	} `json:"relationships"`
}

// TestSBOMIsTheBinarysModules compares the SPDX document beside the
// linux/amd64 image with the binary in the image: the same modules at the
// same versions as its build information (what `go version -m` prints),
// the same Go, the binary's SHA-256 and the image's digest. That is how an
// operator verifies it (docs/operators.md).
func TestSBOMIsTheBinarysModules(t *testing.T) {
	dir := cachedImage(t, "linux/amd64")
	img := imageFor(t, filepath.Join(dir, "oci"), "amd64")
	bin := img.file(t, img.config.Config.Entrypoint[0])
	info, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	var doc spdxDocument
	if err := json.Unmarshal(readFile(t, filepath.Join(dir, "watchgate-linux-amd64.spdx.json")), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SPDXVersion != "SPDX-2.3" {
		t.Errorf("spdxVersion %q", doc.SPDXVersion)
	}

	byID := map[string]int{}
	for i, p := range doc.Packages {
		byID[p.SPDXID] = i
	}
	checksum := func(id string) string {
		i, ok := byID[id]
		if !ok || len(doc.Packages[i].Checksums) != 1 || doc.Packages[i].Checksums[0].Algorithm != "SHA256" {
			t.Fatalf("the SBOM has no package %s with a SHA256 checksum", id)
		}
		return doc.Packages[i].Checksums[0].ChecksumValue
	}
	sum := sha256.Sum256(bin)
	if got := checksum("SPDXRef-Binary"); got != hex.EncodeToString(sum[:]) {
		t.Errorf("the SBOM's binary has SHA-256 %s, the image's /watchgate %x", got, sum)
	}
	if got, want := "sha256:"+checksum("SPDXRef-Image"), img.digest; got != want {
		t.Errorf("the SBOM describes image %s, the layout's is %s", got, want)
	}
	if !strings.HasSuffix(doc.DocumentNamespace, strings.TrimPrefix(img.digest, "sha256:")) {
		t.Errorf("documentNamespace %s is not named after the image %s", doc.DocumentNamespace, img.digest)
	}

	// What the binary depends on, by the SBOM and by its build information.
	inSBOM := map[string]string{}
	for _, r := range doc.Relationships {
		if r.SPDXElementID == "SPDXRef-Binary" && r.RelationshipType == "DEPENDS_ON" {
			p := doc.Packages[byID[r.RelatedSPDXElement]]
			inSBOM[p.Name] = p.VersionInfo
		}
	}
	inBinary := map[string]string{"stdlib": info.GoVersion}
	for _, m := range info.Deps {
		// A module replaced by another version is listed as that one; one
		// replaced by a folder has no version of its own.
		if r := m.Replace; r != nil && r.Version != "" && r.Version != "(devel)" {
			m = r
		}
		inBinary[m.Path] = m.Version
	}
	if !maps.Equal(inSBOM, inBinary) {
		for _, k := range slices.Sorted(maps.Keys(inBinary)) {
			if inSBOM[k] != inBinary[k] {
				t.Errorf("module %s: the binary has %q, the SBOM %q", k, inBinary[k], inSBOM[k])
			}
		}
		for _, k := range slices.Sorted(maps.Keys(inSBOM)) {
			if _, ok := inBinary[k]; !ok {
				t.Errorf("the SBOM lists %s %s, which is not in the binary", k, inSBOM[k])
			}
		}
	}
	if len(inBinary) < 20 {
		t.Errorf("the binary's build information lists %d modules; is it watchgate?", len(inBinary))
	}
	if info.Main.Path != "github.com/watchgate/watchgate" {
		t.Errorf("the image's binary is %s", info.Main.Path)
	}
}

// TestBinaryArchitectures reads the ELF header of the binary in each
// platform's image. The arm64 image comes from bin/image when `make image`
// wrote it there, else from a cached build of that platform alone.
func TestBinaryArchitectures(t *testing.T) {
	arm64 := filepath.Join(root, "bin", "image")
	if _, err := os.Stat(filepath.Join(arm64, "oci", "index.json")); err != nil {
		arm64 = cachedImage(t, "linux/arm64")
	} else {
		t.Logf("the arm64 image is the one in %s", arm64)
	}
	for _, c := range []struct {
		dir, arch string
		machine   elf.Machine
	}{
		{cachedImage(t, "linux/amd64"), "amd64", elf.EM_X86_64},
		{arm64, "arm64", elf.EM_AARCH64},
	} {
		img := imageFor(t, filepath.Join(c.dir, "oci"), c.arch)
		f, err := elf.NewFile(bytes.NewReader(img.file(t, img.config.Config.Entrypoint[0])))
		if err != nil {
			t.Fatalf("linux/%s: the entrypoint is not an ELF file: %v", c.arch, err)
		}
		if f.Machine != c.machine || f.Class != elf.ELFCLASS64 {
			t.Errorf("linux/%s: the entrypoint is built for %s (%s), want %s", c.arch, f.Machine, f.Class, c.machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("linux/%s: the entrypoint asks for a dynamic loader; want a static binary", c.arch)
			}
		}
	}
}
