package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// cachedImage returns the folder hack/image wrote for the single platform
// (linux/amd64 or linux/arm64) of the current sources: oci/, the tarball
// and the SBOM. It builds it the first time and keeps it under the cache
// folder, keyed by the content of everything the image is built from, so
// that the same sources (whatever the commit) reuse it. Folders not used
// for a week are removed.
//
// The cached image is stamped with version "test", its content key as the
// revision, and time 0 (SOURCE_DATE_EPOCH=0): a function of the key alone.
func cachedImage(t *testing.T, platform string) string {
	t.Helper()
	key := contentKey(t, platform)
	cache := filepath.Join(cacheDir(t), "image")
	dir := filepath.Join(cache, strings.ReplaceAll(platform, "/", "-")+"-"+key[:20])
	if _, err := os.Stat(filepath.Join(dir, "oci", "index.json")); err == nil {
		now := time.Now()
		_ = os.Chtimes(dir, now, now)
		return dir
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	evict(cache, 7*24*time.Hour)
	// Staged inside the cache, not in t.TempDir: the finished image is
	// renamed into place, which works within one file system only.
	staging, err := os.MkdirTemp(cache, ".build-") //nolint:usetesting // see above

	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(staging)

	t.Logf("building the %s image of the current sources into %s (a few minutes the first time)", platform, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()
	out := filepath.Join(staging, "out")
	cmd := exec.CommandContext(ctx, "go", "run", ".", "-src", root, "-out", out,
		"-platforms", platform, "-version", "test", "-revision", key)
	cmd.Dir = filepath.Join(root, "hack", "image")
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=0")
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/image: %v\n%s", err, output.String())
	}
	// Another test run may have finished the same build first: its folder
	// is as good as ours.
	if err := os.Rename(out, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, "oci", "index.json")); statErr != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// cacheDir is ${XDG_CACHE_HOME:-$HOME/.cache}/watchgate.
func cacheDir(t *testing.T) string {
	t.Helper()
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "watchgate")
}

// evict removes the cached images (and abandoned builds) in cache not used
// for longer than age.
func evict(cache string, age time.Duration) {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	for _, e := range entries {
		info, err := e.Info()
		if err == nil && time.Since(info.ModTime()) > age {
			_ = os.RemoveAll(filepath.Join(cache, e.Name()))
		}
	}
}

// contentKey hashes what the image of platform is built from: the Go
// version, every Go and embedded file of the module's packages the binary
// compiles for that platform, go.mod, go.sum and LICENSE, and the
// non-test files of hack/image.
func contentKey(t *testing.T, platform string) string {
	t.Helper()
	goos, goarch, _ := strings.Cut(platform, "/")
	goEnv := append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch, "GOFLAGS=")
	goVersion := command(t, root, goEnv, "go", "env", "GOVERSION")
	listing := command(t, root, goEnv, "go", "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{range .GoFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}{{range .SFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}{{end}}{{end}}`, ".")
	files := strings.Fields(listing)
	for _, f := range []string{"go.mod", "go.sum", "LICENSE"} {
		files = append(files, filepath.Join(root, f))
	}
	tool, err := os.ReadDir(filepath.Join(root, "hack", "image"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range tool {
		if n := e.Name(); e.Type().IsRegular() && !strings.HasSuffix(n, "_test.go") && (strings.HasSuffix(n, ".go") || n == "go.mod" || n == "go.sum") {
			files = append(files, filepath.Join(root, "hack", "image", n))
		}
	}
	slices.Sort(files)
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", goVersion, platform)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(h, "%s %x\n", filepath.ToSlash(rel), sum)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// command runs name in dir with env and returns its trimmed stdout.
func command(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
