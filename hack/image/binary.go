package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// buildBinary compiles the Go main package in src for platform into dir
// and returns the binary's path.
func buildBinary(ctx context.Context, src, dir, version string, platform v1.Platform) (string, error) {
	out := filepath.Join(dir, "watchgate-"+platform.OS+"-"+platform.Architecture)
	args := append(goBuildArgs(version), "-o", out, ".")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), goBuildEnv...)
	cmd.Env = append(cmd.Env, "GOOS="+platform.OS, "GOARCH="+platform.Architecture)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go %s for %s: %w", strings.Join(args, " "), platformString(platform), err)
	}
	return out, nil
}

// parsePlatform reads os/arch; arm64 gets the variant v8, as registries and
// Docker name it.
func parsePlatform(s string) (v1.Platform, error) {
	os, arch, ok := strings.Cut(s, "/")
	if !ok || os != "linux" || (arch != "amd64" && arch != "arm64") {
		return v1.Platform{}, fmt.Errorf("platform %q: want linux/amd64 or linux/arm64", s)
	}
	p := v1.Platform{OS: os, Architecture: arch}
	if arch == "arm64" {
		p.Variant = "v8"
	}
	return p, nil
}

func platformString(p v1.Platform) string { return p.OS + "/" + p.Architecture }
