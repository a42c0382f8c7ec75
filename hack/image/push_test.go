package main

import (
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestCranePushesTheLayoutAndTheTarballs pushes what the command wrote to
// a registry (go-containerregistry's own, in memory), loading it as `crane
// push <path> <ref>` does: the layout as the one multi-platform image its
// index.json names, each tarball as one image. The registry then serves
// the layout's digests, and the tarballs' config and layers (crane push
// sends a tarball's image with a Docker manifest of its own).
func TestCranePushesTheLayoutAndTheTarballs(t *testing.T) {
	out := built(t)
	idx, imgs := platformsOf(t, out)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host

	// crane push bin/image/oci <ref>: a layout with one entry, an index.
	l, err := layout.ImageIndexFromPath(filepath.Join(out, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := l.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		t.Fatalf("crane push would need --index: index.json has %d entries", len(m.Manifests))
	}
	pushed, err := l.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host + "/watchgate:multi")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, pushed); err != nil {
		t.Fatalf("push the layout: %v", err)
	}
	got, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	if digestOf(t, got) != digestOf(t, idx) {
		t.Errorf("the registry serves index %s, the layout holds %s", digestOf(t, got), digestOf(t, idx))
	}
	for platform, img := range imgs {
		p, err := v1.ParsePlatform(platform)
		if err != nil {
			t.Fatal(err)
		}
		served, err := remote.Image(ref, remote.WithPlatform(*p))
		if err != nil {
			t.Fatalf("pull %s for %s: %v", ref, platform, err)
		}
		if digestOf(t, served) != digestOf(t, img) {
			t.Errorf("%s: the registry serves %s, the layout holds %s", platform, digestOf(t, served), digestOf(t, img))
		}
	}

	// crane push watchgate-linux-<arch>.tar <ref>.
	for platform, arch := range map[string]string{"linux/amd64": "amd64", "linux/arm64/v8": "arm64"} {
		img, err := crane.Load(filepath.Join(out, "watchgate-linux-"+arch+".tar"))
		if err != nil {
			t.Fatal(err)
		}
		dst := host + "/watchgate:" + arch
		if err := crane.Push(img, dst); err != nil {
			t.Fatalf("push the %s tarball: %v", arch, err)
		}
		served, err := crane.Pull(dst)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := contentOf(t, served), contentOf(t, imgs[platform]); !slices.Equal(got, want) {
			t.Errorf("%s tarball: the registry serves config and layers %v, the layout's image %v", arch, got, want)
		}
	}
}

func digestOf(t *testing.T, d interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}
