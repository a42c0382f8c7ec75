package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// The parts of the OCI image layout, index, manifest and config
// (https://github.com/opencontainers/image-spec) the tests read.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant,omitempty"`
}

type index struct {
	Manifests   []descriptor      `json:"manifests"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type manifest struct {
	Config      descriptor        `json:"config"`
	Layers      []descriptor      `json:"layers"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type imageConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		User         string              `json:"User"`
		Env          []string            `json:"Env"`
		Entrypoint   []string            `json:"Entrypoint"`
		Cmd          []string            `json:"Cmd"`
		WorkingDir   string              `json:"WorkingDir"`
		ExposedPorts map[string]struct{} `json:"ExposedPorts"`
		Labels       map[string]string   `json:"Labels"`
	} `json:"config"`
}

const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// ociImage is one platform's image in an OCI image layout.
type ociImage struct {
	layout   string
	digest   string
	manifest manifest
	config   imageConfig
}

// imageFor finds the linux image for arch in the layout at dir, through
// index.json and the image indexes it names.
func imageFor(t *testing.T, dir, arch string) ociImage {
	t.Helper()
	var top index
	if err := json.Unmarshal(readFile(t, filepath.Join(dir, "index.json")), &top); err != nil {
		t.Fatalf("%s/index.json: %v", dir, err)
	}
	var found []descriptor
	var walk func(descs []descriptor)
	walk = func(descs []descriptor) {
		for _, d := range descs {
			switch d.MediaType {
			case mediaTypeIndex:
				var idx index
				if err := json.Unmarshal(blob(t, dir, d), &idx); err != nil {
					t.Fatal(err)
				}
				walk(idx.Manifests)
			case mediaTypeManifest:
				if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == arch {
					found = append(found, d)
				}
			}
		}
	}
	walk(top.Manifests)
	if len(found) != 1 {
		t.Fatalf("layout %s: want one linux/%s image, found %d", dir, arch, len(found))
	}
	img := ociImage{layout: dir, digest: found[0].Digest}
	if err := json.Unmarshal(blob(t, dir, found[0]), &img.manifest); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(blob(t, dir, img.manifest.Config), &img.config); err != nil {
		t.Fatal(err)
	}
	if img.config.OS != "linux" || img.config.Architecture != arch {
		t.Fatalf("the linux/%s manifest's config is for %s/%s", arch, img.config.OS, img.config.Architecture)
	}
	return img
}

// blob reads the blob d names and checks its size and digest.
func blob(t *testing.T, layout string, d descriptor) []byte {
	t.Helper()
	alg, hexDigest, ok := strings.Cut(d.Digest, ":")
	if !ok || alg != "sha256" {
		t.Fatalf("digest %q: want sha256", d.Digest)
	}
	b := readFile(t, filepath.Join(layout, "blobs", alg, hexDigest))
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != hexDigest || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: content does not match its descriptor", d.Digest)
	}
	return b
}

// eachEntry calls fn for every entry of every layer of img, in order.
func (img ociImage) eachEntry(t *testing.T, fn func(h *tar.Header, r io.Reader) error) {
	t.Helper()
	for _, l := range img.manifest.Layers {
		if l.MediaType != mediaTypeLayer {
			t.Fatalf("layer %s is %s, want %s", l.Digest, l.MediaType, mediaTypeLayer)
		}
		zr, err := gzip.NewReader(bytes.NewReader(blob(t, img.layout, l)))
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
			if err := fn(h, tr); err != nil {
				t.Fatalf("layer %s, %s: %v", l.Digest, h.Name, err)
			}
		}
	}
}

// file returns the content of the regular file at p (absolute) in img,
// as the last layer that holds it has it.
func (img ociImage) file(t *testing.T, p string) []byte {
	t.Helper()
	var data []byte
	img.eachEntry(t, func(h *tar.Header, r io.Reader) error {
		if path.Clean("/"+h.Name) != p {
			return nil
		}
		if h.Typeflag != tar.TypeReg {
			return fmt.Errorf("not a regular file")
		}
		var err error
		data, err = io.ReadAll(r)
		return err
	})
	if data == nil {
		t.Fatalf("image %s has no %s", img.digest, p)
	}
	return data
}

// unpack writes img's layers into root as a container runtime would: each
// layer over the ones before, whiteouts removing what they name, owners
// and modes as the layer says. It returns the entries not owned by root.
func (img ociImage) unpack(t *testing.T, root string) (notRoot []string) {
	t.Helper()
	img.eachEntry(t, func(h *tar.Header, r io.Reader) error {
		name := path.Clean("/" + h.Name)
		if name == "/" {
			return nil
		}
		if h.Uid != 0 || h.Gid != 0 {
			notRoot = append(notRoot, fmt.Sprintf("%s (%d:%d)", name, h.Uid, h.Gid))
		}
		target := filepath.Join(root, filepath.FromSlash(name))
		dir, base := path.Split(name)
		switch {
		case base == ".wh..wh..opq":
			entries, err := os.ReadDir(filepath.Join(root, dir))
			for _, e := range entries {
				if err := os.RemoveAll(filepath.Join(root, dir, e.Name())); err != nil {
					return err
				}
			}
			return err
		case strings.HasPrefix(base, ".wh."):
			return os.RemoveAll(filepath.Join(root, dir, strings.TrimPrefix(base, ".wh.")))
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(h.Mode).Perm()
		if h.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(target, 0o700); err != nil && !os.IsExist(err) {
				return err
			}
		case tar.TypeReg:
			_ = os.RemoveAll(target)
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, r)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			_ = os.RemoveAll(target)
			return errors.Join(os.Symlink(h.Linkname, target), os.Lchown(target, h.Uid, h.Gid))
		case tar.TypeLink:
			_ = os.RemoveAll(target)
			return os.Link(filepath.Join(root, filepath.FromSlash(path.Clean("/"+h.Linkname))), target)
		default:
			return fmt.Errorf("entry type %q is not expected in this image", h.Typeflag)
		}
		if h.Mode&0o6000 != 0 {
			return fmt.Errorf("setuid or setgid bit (mode %o)", h.Mode)
		}
		return errors.Join(os.Lchown(target, h.Uid, h.Gid), os.Chmod(target, mode))
	})
	return notRoot
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
