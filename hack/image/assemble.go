package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// release is what names and dates one build, the same for every platform.
type release struct {
	repository, version, revision string
	// created is SOURCE_DATE_EPOCH: every time in the output.
	created time.Time
}

// tagChars are the characters a tag may not hold.
var tagChars = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// tagFor turns a version (git describe's output) into a tag: '+' and other
// characters a tag may not hold become '-'.
func tagFor(version string) string {
	t := tagChars.ReplaceAllString(version, "-")
	if t == "" || t[0] == '.' || t[0] == '-' {
		t = "v" + t
	}
	return t
}

func (r release) ref() string { return r.repository + ":" + tagFor(r.version) }

func (r release) labels() map[string]string { return labels(r.version, r.revision, r.created) }

// platformImage is one platform's image: the shared base layer, then the
// binary's layer, with the config every platform shares (spec.go) and the
// labels repeated as the manifest's annotations.
func platformImage(base v1.Layer, binary []byte, p v1.Platform, r release) (v1.Image, error) {
	bin, err := newLayer([]entry{file(binaryPath, 0o755, binary)}, r.created)
	if err != nil {
		return nil, err
	}
	at := v1.Time{Time: r.created}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{Created: at,
			CreatedBy: "hack/image: /etc/passwd, /etc/group, /etc/nsswitch.conf, " + caBundlePath + ", " + licensePath + ", /tmp"}},
		mutate.Addendum{Layer: bin, MediaType: types.OCILayer, History: v1.History{Created: at,
			CreatedBy: strings.Join(goBuildEnv, " ") + " go " + strings.Join(goBuildArgs(r.version), " ") + " ."}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = at
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	ports := map[string]struct{}{}
	for _, port := range exposedPorts {
		ports[port] = struct{}{}
	}
	cf.Config = v1.Config{
		User:         imageUser,
		Entrypoint:   []string{binaryPath},
		Env:          imageEnv,
		ExposedPorts: ports,
		Labels:       r.labels(),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, r.labels()).(v1.Image), nil
}

// imageIndex is the multi-platform image: an OCI image index of the
// platforms' images, annotated like each of them.
func imageIndex(imgs []v1.Image, platforms []v1.Platform, r release) v1.ImageIndex {
	var adds []mutate.IndexAddendum
	for i, img := range imgs {
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &platforms[i]}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	return mutate.Annotations(idx, r.labels()).(v1.ImageIndex)
}

// writeLayout writes idx as an OCI image layout at dir. index.json names
// idx by its tag (org.opencontainers.image.ref.name, which skopeo's
// oci:<dir>:<tag> reads) and full name (io.containerd.image.name, which
// containerd's and Docker's import read), as docker buildx's OCI output
// does; `crane push <dir> <ref>` pushes it as one multi-platform image.
func writeLayout(dir string, idx v1.ImageIndex, r release) error {
	top := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: idx, Descriptor: v1.Descriptor{
		Annotations: map[string]string{
			"org.opencontainers.image.ref.name": tagFor(r.version),
			"io.containerd.image.name":          r.ref(),
		},
	}})
	_, err := layout.Write(dir, top)
	return err
}

// writeSBOM writes the SPDX document of the image of platform p, whose
// binary is at binary.
func writeSBOM(path string, img v1.Image, binary string, p v1.Platform, r release) error {
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	doc, err := newSBOM(sbomInput{repository: r.repository, version: r.version, platform: p, manifest: digest, binary: binary, created: r.created})
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// outputName is the file name prefix of a platform's tarball and SBOM.
func outputName(p v1.Platform) string { return "watchgate-" + p.OS + "-" + p.Architecture }

// assemble builds the image of every platform from its binary and writes
// the layout, the tarballs and the SBOMs into out, which must exist.
func assemble(out string, base []entry, binaries []string, platforms []v1.Platform, r release) (v1.ImageIndex, error) {
	baseLayer, err := newLayer(base, r.created)
	if err != nil {
		return nil, err
	}
	var imgs []v1.Image
	for i, p := range platforms {
		bin, err := os.ReadFile(binaries[i])
		if err != nil {
			return nil, err
		}
		img, err := platformImage(baseLayer, bin, p, r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", platformString(p), err)
		}
		imgs = append(imgs, img)
		if err := writeArchive(filepath.Join(out, outputName(p)+".tar"), img, r); err != nil {
			return nil, fmt.Errorf("%s tarball: %w", platformString(p), err)
		}
		if err := writeSBOM(filepath.Join(out, outputName(p)+".spdx.json"), img, binaries[i], p, r); err != nil {
			return nil, fmt.Errorf("%s SBOM: %w", platformString(p), err)
		}
	}
	idx := imageIndex(imgs, platforms, r)
	if err := writeLayout(filepath.Join(out, "oci"), idx, r); err != nil {
		return nil, fmt.Errorf("OCI layout: %w", err)
	}
	return idx, nil
}
