// Command imagetar writes a one-layer image holding one static binary as a
// `docker save` tarball, which `ctr -n k8s.io images import` reads: the
// cluster's pause image and the tests' small programs, built without a
// container engine or a registry.
//
//	imagetar -binary bin/agent -ref localhost/watchgate/agent:test -out agent.tar
//
// The binary is /<its name> in the image, the entrypoint, owned by root and
// run as -user (65532, nonroot, by default), with /tmp for the programs that
// need a writable folder. Every time in it is the Unix epoch, so a binary
// gives one image.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	binary := flag.String("binary", "", "Static binary to put at /<name> and run.")
	ref := flag.String("ref", "", "Image reference to tag the image with, e.g. localhost/watchgate/agent:test.")
	out := flag.String("out", "", "Tarball to write.")
	user := flag.String("user", "65532:65532", "User the image runs as.")
	flag.Parse()
	if err := run(*binary, *ref, *out, *user); err != nil {
		fmt.Fprintln(os.Stderr, "imagetar:", err)
		os.Exit(1)
	}
}

func run(binary, ref, out, user string) error {
	if binary == "" || ref == "" || out == "" {
		return fmt.Errorf("-binary, -ref and -out are required")
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	content, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	entry := "/" + filepath.Base(binary)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, h := range []*tar.Header{
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: epoch},
		{Name: entry[1:], Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(content)), ModTime: epoch},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	if _, err := tw.Write(content); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS, cfg.Created = "amd64", "linux", v1.Time{Time: epoch}
	cfg.Config.Entrypoint = []string{entry}
	cfg.Config.User = user
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, tag, img)
}
