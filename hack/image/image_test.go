package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The tests build testdata/hello, a small main package with one (replaced)
// dependency, instead of watchgate: the same code path in seconds.
const (
	testEpoch   = "1700000000"
	testVersion = "v1.2.3+meta"
	testRepo    = "registry.example/watchgate"
)

var (
	builtOnce sync.Once
	builtDir  string
	builtErr  error
)

// buildHello runs the command on testdata/hello for both platforms into
// out.
func buildHello(t *testing.T, out, epoch string) {
	t.Helper()
	t.Setenv("SOURCE_DATE_EPOCH", epoch)
	err := run(t.Context(), []string{"-src", "testdata/hello", "-out", out, "-repository", testRepo,
		"-version", testVersion, "-revision", "0123456789abcdef0123456789abcdef01234567"})
	if err != nil {
		t.Fatal(err)
	}
}

// built returns the folder of one build shared by the tests that only
// read it.
func built(t *testing.T) string {
	t.Helper()
	builtOnce.Do(func() {
		// Shared by every test that reads it, so it outlives the first
		// one's t.TempDir; TestMain removes it.
		builtDir, builtErr = os.MkdirTemp("", "image-test-") //nolint:usetesting // see above
		if builtErr != nil {
			return
		}
		t.Setenv("SOURCE_DATE_EPOCH", testEpoch)
		builtErr = run(t.Context(), []string{"-src", "testdata/hello", "-out", filepath.Join(builtDir, "out"), "-repository", testRepo,
			"-version", testVersion, "-revision", "0123456789abcdef0123456789abcdef01234567"})
	})
	if builtErr != nil {
		t.Fatal(builtErr)
	}
	return filepath.Join(builtDir, "out")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	os.Exit(code)
}

// platformsOf reads the layout at dir: index.json must name exactly one
// image index, tagged; it returns that index's images by platform.
func platformsOf(t *testing.T, dir string) (v1.ImageIndex, map[string]v1.Image) {
	t.Helper()
	top, err := layout.ImageIndexFromPath(filepath.Join(dir, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || !tm.Manifests[0].MediaType.IsIndex() {
		t.Fatalf("index.json: want one image index, got %+v", tm.Manifests)
	}
	if got := tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; got != "v1.2.3-meta" {
		t.Errorf("index.json ref.name = %q, want the version as a tag, v1.2.3-meta", got)
	}
	if got := tm.Manifests[0].Annotations["io.containerd.image.name"]; got != testRepo+":v1.2.3-meta" {
		t.Errorf("index.json io.containerd.image.name = %q", got)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	imgs := map[string]v1.Image{}
	for _, d := range m.Manifests {
		if d.Platform == nil {
			t.Fatalf("manifest %s has no platform", d.Digest)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		imgs[d.Platform.String()] = img
	}
	return idx, imgs
}

func TestLayoutHoldsBothPlatforms(t *testing.T) {
	idx, imgs := platformsOf(t, built(t))
	if got := slices.Sorted(maps.Keys(imgs)); !slices.Equal(got, []string{"linux/amd64", "linux/arm64/v8"}) {
		t.Fatalf("platforms %v, want linux/amd64 and linux/arm64/v8", got)
	}
	wantLabels := labels(testVersion, "0123456789abcdef0123456789abcdef01234567", time.Unix(1700000000, 0))
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(im.Annotations, wantLabels) {
		t.Errorf("index annotations %v, want %v", im.Annotations, wantLabels)
	}
	machines := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64/v8": elf.EM_AARCH64}
	for platform, img := range imgs {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Platform().String() != platform {
			t.Errorf("%s: config says %s", platform, cf.Platform())
		}
		c := cf.Config
		if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/watchgate"}) || len(c.Cmd) != 0 {
			t.Errorf("%s: user %q entrypoint %q cmd %q, want 65532:65532, [/watchgate], none", platform, c.User, c.Entrypoint, c.Cmd)
		}
		if got := slices.Sorted(maps.Keys(c.ExposedPorts)); !slices.Equal(got, []string{"8080/tcp", "8081/tcp", "8443/tcp"}) {
			t.Errorf("%s: exposed ports %v", platform, got)
		}
		if !maps.Equal(c.Labels, wantLabels) {
			t.Errorf("%s: labels %v, want %v", platform, c.Labels, wantLabels)
		}
		if !cf.Created.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("%s: created %s, want SOURCE_DATE_EPOCH", platform, cf.Created)
		}
		m, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(m.Annotations, wantLabels) {
			t.Errorf("%s: manifest annotations %v, want the labels", platform, m.Annotations)
		}

		files := imageFiles(t, img)
		bin, ok := files["watchgate"]
		if !ok {
			t.Fatalf("%s: no /watchgate in the image", platform)
		}
		if bin.mode != 0o755 {
			t.Errorf("%s: /watchgate mode %o, want 755", platform, bin.mode)
		}
		f, err := elf.NewFile(bytes.NewReader(bin.data))
		if err != nil {
			t.Fatalf("%s: /watchgate is not ELF: %v", platform, err)
		}
		if f.Machine != machines[platform] {
			t.Errorf("%s: /watchgate is built for %s", platform, f.Machine)
		}
		if slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
			t.Errorf("%s: /watchgate asks for a dynamic loader; want a static binary", platform)
		}
		for _, e := range baseFiles([]byte("The licence of the test program.\n")) {
			got, ok := files[strings.TrimPrefix(e.path, "/")]
			switch {
			case !ok:
				t.Errorf("%s: %s missing", platform, e.path)
			case got.mode != int64(e.describe().modeBits()):
				t.Errorf("%s: %s mode %o, want %s", platform, e.path, got.mode, e.describe().Mode)
			case !bytes.Equal(got.data, e.data):
				t.Errorf("%s: %s has other content than the base files", platform, e.path)
			}
		}
		if len(files) != len(baseFiles(nil))+1 {
			t.Errorf("%s: %d entries, want the base files and the binary only", platform, len(files))
		}
	}
}

// modeBits is the tar mode of a described entry.
func (d describedFile) modeBits() int64 {
	var m int64
	for _, c := range d.Mode {
		m = m*8 + int64(c-'0')
	}
	return m
}

// layerFile is a file or folder of an image, as its layer holds it.
type layerFile struct {
	mode int64
	data []byte
}

// imageFiles reads every layer of img; it fails on an entry not owned by
// root or stamped with another time than SOURCE_DATE_EPOCH.
func imageFiles(t *testing.T, img v1.Image) map[string]layerFile {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]layerFile{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Uid != 0 || h.Gid != 0 {
				t.Errorf("%s is owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
			}
			if !h.ModTime.Equal(time.Unix(1700000000, 0)) {
				t.Errorf("%s: mtime %s, want SOURCE_DATE_EPOCH", h.Name, h.ModTime)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[strings.TrimSuffix(h.Name, "/")] = layerFile{mode: h.Mode, data: data}
		}
		rc.Close()
	}
	return files
}

// TestSameSourcesSameDigest builds twice with one SOURCE_DATE_EPOCH: the
// same bytes everywhere; and once with another: another digest.
func TestSameSourcesSameDigest(t *testing.T) {
	first := built(t)
	second := filepath.Join(t.TempDir(), "out")
	buildHello(t, second, testEpoch)
	for _, f := range []string{"oci/index.json", "watchgate-linux-amd64.tar", "watchgate-linux-arm64.tar", "watchgate-linux-amd64.spdx.json", "watchgate-linux-arm64.spdx.json"} {
		a, err := os.ReadFile(filepath.Join(first, f))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(second, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two builds of the same sources", f)
		}
	}

	later := filepath.Join(t.TempDir(), "out")
	buildHello(t, later, "1700000001")
	a, _ := os.ReadFile(filepath.Join(first, "oci/index.json"))
	b, _ := os.ReadFile(filepath.Join(later, "oci/index.json"))
	if bytes.Equal(a, b) {
		t.Error("another SOURCE_DATE_EPOCH gave the same index: the time is not in the image")
	}
}

// TestTarballIsWhatDockerLoadAndCranePushRead reads each tarball as crane
// push does (go-containerregistry's tarball package, manifest.json, which
// `docker load` reads too): the layout's config and layers, tagged. And as
// an OCI layout (index.json): the layout's very manifest.
func TestTarballIsWhatDockerLoadAndCranePushRead(t *testing.T) {
	out := built(t)
	_, imgs := platformsOf(t, out)
	tag, err := name.NewTag(testRepo + ":v1.2.3-meta")
	if err != nil {
		t.Fatal(err)
	}
	for platform, arch := range map[string]string{"linux/amd64": "amd64", "linux/arm64/v8": "arm64"} {
		path := filepath.Join(out, "watchgate-linux-"+arch+".tar")
		img, err := tarball.ImageFromPath(path, &tag)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if got, want := contentOf(t, img), contentOf(t, imgs[platform]); !slices.Equal(got, want) {
			t.Errorf("%s holds config and layers %v, the layout's %s image %v", path, got, platform, want)
		}

		var saved []struct {
			Config   string
			RepoTags []string
			Layers   []string
		}
		if err := json.Unmarshal(tarEntry(t, path, "manifest.json"), &saved); err != nil {
			t.Fatal(err)
		}
		if len(saved) != 1 || !slices.Equal(saved[0].RepoTags, []string{tag.String()}) || saved[0].Config == "" || len(saved[0].Layers) != 2 {
			t.Errorf("%s manifest.json = %+v, want one image tagged %s with a config and two layers", path, saved, tag)
		}

		var index v1.IndexManifest
		if err := json.Unmarshal(tarEntry(t, path, "index.json"), &index); err != nil {
			t.Fatal(err)
		}
		want := digestOf(t, imgs[platform])
		if len(index.Manifests) != 1 || index.Manifests[0].Digest.String() != want ||
			index.Manifests[0].Annotations["io.containerd.image.name"] != tag.String() {
			t.Fatalf("%s index.json = %+v, want the layout's manifest %s named %s", path, index, want, tag)
		}
		manifest := tarEntry(t, path, "blobs/sha256/"+index.Manifests[0].Digest.Hex)
		if sum := sha256.Sum256(manifest); "sha256:"+hex.EncodeToString(sum[:]) != want {
			t.Errorf("%s: the manifest blob does not match its digest", path)
		}
	}
}

// contentOf lists an image's config digest and layer digests: what a
// Docker manifest and an OCI manifest of the same image share.
func contentOf(t *testing.T, img v1.Image) []string {
	t.Helper()
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	out := []string{cfg.String()}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d.String())
	}
	return out
}

// tarEntry returns the content of the file name in the tar file at path.
func tarEntry(t *testing.T, path, name string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s has no %s: %v", path, name, err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

// TestSBOMListsTheModulesOfTheBinary reads each platform's SPDX document:
// it names the image by digest, the binary in it by checksum, the Go
// toolchain, and the dependency (replaced by a local folder).
func TestSBOMListsTheModulesOfTheBinary(t *testing.T) {
	out := built(t)
	_, imgs := platformsOf(t, out)
	for platform, arch := range map[string]string{"linux/amd64": "amd64", "linux/arm64/v8": "arm64"} {
		b, err := os.ReadFile(filepath.Join(out, "watchgate-linux-"+arch+".spdx.json"))
		if err != nil {
			t.Fatal(err)
		}
		var doc spdxDocument
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		digest, err := imgs[platform].Digest()
		if err != nil {
			t.Fatal(err)
		}
		if doc.SPDXVersion != "SPDX-2.3" || !strings.HasSuffix(doc.DocumentNamespace, "/"+digest.Hex) {
			t.Errorf("%s: version %s namespace %s, want SPDX-2.3 named after %s", platform, doc.SPDXVersion, doc.DocumentNamespace, digest)
		}
		if doc.CreationInfo.Created != "2023-11-14T22:13:20Z" {
			t.Errorf("%s: created %s, want SOURCE_DATE_EPOCH", platform, doc.CreationInfo.Created)
		}
		pkgs := map[string]spdxPackage{}
		for _, p := range doc.Packages {
			pkgs[p.SPDXID] = p
		}
		if img := pkgs["SPDXRef-Image"]; len(img.Checksums) != 1 || img.Checksums[0].ChecksumValue != digest.Hex || !strings.Contains(img.ExternalRefs[0].ReferenceLocator, "arch="+arch) {
			t.Errorf("%s: image package %+v does not name the image %s", platform, img, digest)
		}
		bin := imageFiles(t, imgs[platform])["watchgate"].data
		sum := sha256.Sum256(bin)
		if got := pkgs["SPDXRef-Binary"]; got.Name != "example.com/hello" || got.VersionInfo != testVersion || got.Checksums[0].ChecksumValue != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: binary package %+v, want example.com/hello %s with the binary's SHA-256", platform, got, testVersion)
		}
		if got := pkgs["SPDXRef-Go-stdlib"].VersionInfo; !strings.HasPrefix(got, "go1.") {
			t.Errorf("%s: stdlib version %q", platform, got)
		}
		if !strings.Contains(pkgs["SPDXRef-Binary"].Comment, "GOARCH="+arch) || !strings.Contains(pkgs["SPDXRef-Binary"].Comment, "CGO_ENABLED=0") {
			t.Errorf("%s: the binary's build settings are not recorded: %s", platform, pkgs["SPDXRef-Binary"].Comment)
		}
		dep, ok := pkgs["SPDXRef-Go-example.com-greeting-v0.0.0"]
		if !ok || !strings.Contains(dep.Comment, "replaced by the folder ../greeting") {
			t.Errorf("%s: the dependency is missing or does not say it is replaced: %+v", platform, doc.Packages)
		}
		if ca := pkgs["SPDXRef-CABundle"]; ca.VersionInfo == "" {
			t.Errorf("%s: the CA bundle has no version: %+v", platform, ca)
		}
		rels := map[string]bool{}
		for _, r := range doc.Relationships {
			rels[r.SPDXElementID+" "+r.RelationshipType+" "+r.RelatedSPDXElement] = true
		}
		for _, want := range []string{"SPDXRef-DOCUMENT DESCRIBES SPDXRef-Image", "SPDXRef-Image CONTAINS SPDXRef-Binary", "SPDXRef-Binary DEPENDS_ON SPDXRef-Go-example.com-greeting-v0.0.0"} {
			if !rels[want] {
				t.Errorf("%s: no relationship %q", platform, want)
			}
		}
	}
}

// TestRootfsIsTheBaseLayer: -rootfs (the Dockerfile's base) writes exactly
// the base layer's files, modes and contents.
func TestRootfsIsTheBaseLayer(t *testing.T) {
	// As in the Dockerfile, the parent does not exist yet.
	root := filepath.Join(t.TempDir(), "out", "rootfs")
	if err := run(t.Context(), []string{"-src", "testdata/hello", "-rootfs", root}); err != nil {
		t.Fatal(err)
	}
	want := map[string]describedFile{}
	for _, e := range baseFiles([]byte("The licence of the test program.\n")) {
		want[e.describe().Path] = e.describe()
	}
	got := map[string]describedFile{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := entry{path: "/" + filepath.ToSlash(strings.TrimPrefix(p, root+"/")), mode: info.Mode() & (fs.ModeDir | fs.ModePerm | fs.ModeSticky)}
		if !d.IsDir() {
			if e.data, err = os.ReadFile(p); err != nil {
				return err
			}
		}
		got[e.describe().Path] = e.describe()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Errorf("-rootfs wrote\n%v\nwant the base layer's\n%v", got, want)
	}
}

// TestDescribeIsTheImage: what -describe prints (the Dockerfile's
// yardstick) is the config every image gets, with the build arguments in
// place of the values that vary.
func TestDescribeIsTheImage(t *testing.T) {
	var buf bytes.Buffer
	if err := describe(&buf, baseFiles(nil)); err != nil {
		t.Fatal(err)
	}
	var d description
	if err := json.Unmarshal(buf.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	_, imgs := platformsOf(t, built(t))
	cf, err := imgs["linux/amd64"].ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	expand := strings.NewReplacer("${VERSION}", testVersion, "${REVISION}", "0123456789abcdef0123456789abcdef01234567", "${CREATED}", "2023-11-14T22:13:20Z")
	labels := map[string]string{}
	for k, v := range d.Labels {
		labels[k] = expand.Replace(v)
	}
	if d.User != c.User || !slices.Equal(d.Entrypoint, c.Entrypoint) || !slices.Equal(d.Env, c.Env) ||
		!sameSet(d.ExposedPorts, slices.Collect(maps.Keys(c.ExposedPorts))) || !maps.Equal(labels, c.Labels) {
		t.Errorf("-describe says %+v; the image's config is %+v", d, c)
	}
	if !slices.Equal(d.Platforms, []string{"linux/amd64", "linux/arm64"}) || d.Repository != "ghcr.io/watchgate/watchgate" {
		t.Errorf("-describe: platforms %v repository %s", d.Platforms, d.Repository)
	}
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
