package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// writeArchive writes one platform's image as a tar that is two formats at
// once, as `docker save` writes since Docker 25:
//
//   - a `docker save` archive: manifest.json names the config and the
//     layers and tags the image with r's reference; `docker load` and
//     `crane push <tar> <ref>` read it. (Neither keeps the OCI manifest: a
//     registry they push to computes a Docker manifest of the same config
//     and layers, under another digest.)
//   - an OCI image layout: index.json names the image's OCI manifest,
//     tagged; containerd's import, Docker 25's loader and skopeo's
//     oci-archive: read it, keeping the manifest and its digest.
//
// Every entry is owned by root and stamped with r.created, in a fixed
// order, so the same image gives the same bytes.
func writeArchive(path string, img v1.Image, r release) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	manifestDigest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	configDigest, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	blobPath := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	saved := tarball.Descriptor{Config: blobPath(configDigest), RepoTags: []string{r.ref()}}
	blobs := map[string]func() (io.ReadCloser, int64, error){
		blobPath(manifestDigest): bytesBlob(manifest),
		blobPath(configDigest):   bytesBlob(config),
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		saved.Layers = append(saved.Layers, blobPath(d))
		blobs[blobPath(d)] = func() (io.ReadCloser, int64, error) {
			size, err := l.Size()
			if err != nil {
				return nil, 0, err
			}
			rc, err := l.Compressed()
			return rc, size, err
		}
	}
	savedJSON, err := json.Marshal(tarball.Manifest{saved})
	if err != nil {
		return err
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: types.OCIManifestSchema1,
			Digest:    manifestDigest,
			Size:      int64(len(manifest)),
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": tagFor(r.version),
				"io.containerd.image.name":          r.ref(),
			},
		}},
	})
	if err != nil {
		return err
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	header := func(name string, typ byte, mode, size int64) error {
		return tw.WriteHeader(&tar.Header{Name: name, Typeflag: typ, Mode: mode, Size: size, ModTime: r.created, Format: tar.FormatPAX})
	}
	file := func(name string, open func() (io.ReadCloser, int64, error)) error {
		rc, size, err := open()
		if err != nil {
			return err
		}
		defer rc.Close()
		if err := header(name, tar.TypeReg, 0o644, size); err != nil {
			return err
		}
		n, err := io.Copy(tw, rc)
		if err == nil && n != size {
			err = fmt.Errorf("%s: %d bytes, want %d", name, n, size)
		}
		return err
	}
	err = writeAll(
		func() error { return file("oci-layout", bytesBlob([]byte(`{"imageLayoutVersion":"1.0.0"}`))) },
		func() error { return file("index.json", bytesBlob(index)) },
		func() error { return file("manifest.json", bytesBlob(savedJSON)) },
		func() error { return header("blobs/", tar.TypeDir, 0o755, 0) },
		func() error { return header("blobs/sha256/", tar.TypeDir, 0o755, 0) },
	)
	for _, name := range slices.Sorted(maps.Keys(blobs)) {
		if err != nil {
			break
		}
		err = file(name, blobs[name])
	}
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func bytesBlob(b []byte) func() (io.ReadCloser, int64, error) {
	return func() (io.ReadCloser, int64, error) { return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil }
}

// writeAll runs steps in order until one fails.
func writeAll(steps ...func() error) error {
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}
