package v1alpha1_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// generated are the files `make manifests generate` writes, relative to the
// repository root; the folders are compared whole, so that a file left
// behind by a renamed type counts as stale too.
var generated = []string{
	"api/v1alpha1/zz_generated.deepcopy.go",
	"api/v1alpha1/applyconfiguration",
	"config/crd/bases",
	"config/rbac/role.yaml",
}

// TestGeneratedFilesAreUpToDate runs `make generate manifests` (generate
// first: the controllers, whose RBAC markers manifests reads, import the
// apply configurations) on a copy of the repository and fails when any generated file differs from the one
// committed: run `make manifests generate` and commit the result.
func TestGeneratedFilesAreUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs controller-gen (about 20 s)")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not found")
	}
	root := repoRoot(t)
	work := t.TempDir()
	copyTree(t, root, work)
	// Start from nothing, so that stale leftovers show up as extra files.
	for _, path := range generated {
		if err := os.RemoveAll(filepath.Join(work, path)); err != nil {
			t.Fatal(err)
		}
	}

	cmd := exec.CommandContext(t.Context(), "make", "--no-print-directory", "generate", "manifests")
	cmd.Dir = work
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make manifests generate: %v\n%s", err, out)
	}
	for _, path := range generated {
		want, got := readAll(t, filepath.Join(work, path)), readAll(t, filepath.Join(root, path))
		for _, name := range union(want, got) {
			w, inWant := want[name]
			g, inGot := got[name]
			if inWant != inGot || !bytes.Equal(w, g) {
				t.Errorf("%s is stale (or missing, or not generated): run `make generate manifests`", filepath.Join(path, name))
			}
		}
	}
}

// readAll reads a file, or every file under a folder, by relative name.
func readAll(t *testing.T, path string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(path, p)
		files[rel] = b
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func union(a, b map[string][]byte) []string {
	var names []string
	for n := range a {
		names = append(names, n)
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// copyTree copies the sources (not .git, not built binaries) to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			if rel == ".git" || rel == "bin" || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, info.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}
