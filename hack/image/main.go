package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	src, out, repository, version, revision, platforms string
	rootfs                                             string
	describe                                           bool
}

func run(ctx context.Context, args []string) error {
	var o options
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.StringVar(&o.src, "src", "../..", "The watchgate repository: the main package to build, and its LICENSE.")
	fs.StringVar(&o.out, "out", "../../bin/image", "Folder to write the layout, tarballs and SBOMs into; replaced as a whole once everything is written.")
	fs.StringVar(&o.repository, "repository", defaultRepository, "Image name without a tag; the tag is the version.")
	fs.StringVar(&o.version, "version", "", "Version stamped into the binary, the tag and the labels. Default: git describe --tags --always --dirty, else dev.")
	fs.StringVar(&o.revision, "revision", "", "Commit in the org.opencontainers.image.revision label. Default: git rev-parse HEAD, else unknown.")
	fs.StringVar(&o.platforms, "platforms", strings.Join(defaultPlatforms, ","), "Comma-separated platforms: linux/amd64, linux/arm64.")
	fs.StringVar(&o.rootfs, "rootfs", "", "Only write the base files (users, CA bundle, licence, /tmp) into this new folder, for the Dockerfile, and exit.")
	fs.BoolVar(&o.describe, "describe", false, "Only print what every image holds besides the binary, and its config, as JSON, and exit.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	license, err := os.ReadFile(filepath.Join(o.src, "LICENSE"))
	if err != nil {
		return fmt.Errorf("the licence to ship: %w", err)
	}
	base := baseFiles(license)
	switch {
	case o.describe:
		return describe(os.Stdout, base)
	case o.rootfs != "":
		return writeRootfs(o.rootfs, base)
	}
	return build(ctx, o, base)
}

// build compiles every platform's binary, assembles the images into a
// folder beside out, and replaces out with it.
func build(ctx context.Context, o options, base []entry) error {
	var platforms []v1.Platform
	for _, s := range strings.Split(o.platforms, ",") {
		p, err := parsePlatform(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		platforms = append(platforms, p)
	}
	created, err := sourceDateEpoch(ctx, o.src)
	if err != nil {
		return err
	}
	r := release{repository: o.repository, version: o.version, revision: o.revision, created: created}
	if r.version == "" {
		r.version = gitOr(ctx, o.src, "dev", "describe", "--tags", "--always", "--dirty")
	}
	if r.revision == "" {
		r.revision = gitOr(ctx, o.src, "unknown", "rev-parse", "HEAD")
	}
	if _, err := name.NewTag(r.ref(), name.StrictValidation); err != nil {
		return fmt.Errorf("-repository %s with version %s: %w", r.repository, r.version, err)
	}

	staging := o.out + ".tmp"
	if err := os.RemoveAll(staging); err != nil {
		return err
	}
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return err
	}
	binDir, err := os.MkdirTemp("", "watchgate-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)

	var binaries []string
	for _, p := range platforms {
		fmt.Fprintf(os.Stderr, ">> go build for %s\n", platformString(p))
		bin, err := buildBinary(ctx, o.src, binDir, r.version, p)
		if err != nil {
			return err
		}
		binaries = append(binaries, bin)
	}
	idx, err := assemble(staging, base, binaries, platforms, r)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(o.out); err != nil {
		return err
	}
	if err := os.Rename(staging, o.out); err != nil {
		return err
	}
	return summarize(o.out, idx, r)
}

// summarize prints what was written and the digests to push.
func summarize(out string, idx v1.ImageIndex, r release) error {
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s (created %s, revision %s)\n", r.ref(), digest, r.created.UTC().Format(time.RFC3339), r.revision)
	fmt.Printf("  in %s: oci/ (OCI image layout), and per platform a tarball and an SBOM:\n", out)
	for _, d := range m.Manifests {
		name := outputName(*d.Platform)
		fmt.Printf("  %-12s %s  %s.tar  %s.spdx.json\n", platformString(*d.Platform), d.Digest, name, name)
	}
	return nil
}

// sourceDateEpoch is $SOURCE_DATE_EPOCH, else the commit time of HEAD in
// src: the one time every file, config and SBOM carries.
func sourceDateEpoch(ctx context.Context, src string) (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		s = gitOr(ctx, src, "", "log", "-1", "--format=%ct")
	}
	if s == "" {
		return time.Time{}, errors.New("set SOURCE_DATE_EPOCH (seconds since 1970): there is no git commit to take the time from")
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil || sec < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970", s)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// gitOr runs git in dir and returns its trimmed output, or fallback when
// git fails.
func gitOr(ctx context.Context, dir, fallback string, args ...string) string {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return fallback
	}
	return strings.TrimSpace(string(out))
}
