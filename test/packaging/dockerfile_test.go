package packaging

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDockerfile reads the Dockerfile (there is no container engine in the
// test environment) for what the image promises: a Go 1.26 builder, a
// static, trimmed, version-stamped binary, distroless static as non-root
// 65532. And it checks the build context: .dockerignore must not leave out
// any package the binary is built from, and main.version must exist for
// -X to stamp.
func TestDockerfile(t *testing.T) {
	dockerfile := readFile(t, "Dockerfile")
	var froms []string
	var user, build string
	sc := bufio.NewScanner(strings.NewReader(strings.ReplaceAll(dockerfile, "\\\n", " ")))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "FROM "):
			froms = append(froms, line)
		case strings.HasPrefix(line, "USER "):
			user = strings.TrimPrefix(line, "USER ")
		case strings.HasPrefix(line, "RUN ") && strings.Contains(line, "go build"):
			build = line
		}
	}
	if len(froms) != 2 || !strings.Contains(froms[0], "golang:1.26 ") {
		t.Errorf("want a golang:1.26 builder stage and a final stage, got %q", froms)
	}
	if len(froms) > 0 && froms[len(froms)-1] != "FROM gcr.io/distroless/static:nonroot" {
		t.Errorf("final stage = %q, want FROM gcr.io/distroless/static:nonroot", froms[len(froms)-1])
	}
	if user != "65532:65532" {
		t.Errorf("USER %q, want 65532:65532 (numeric, so runAsNonRoot can verify it)", user)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}", "go build"} {
		if !strings.Contains(build, want) {
			t.Errorf("the build step lacks %q: %s", want, build)
		}
	}

	// Every package of the module the binary imports must be in the build
	// context.
	ignored := dockerignoredDirs(t)
	cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", ".")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		top := strings.Split(filepath.ToSlash(rel), "/")[0]
		if ignored[top] {
			t.Errorf("the binary imports %s, which .dockerignore leaves out of the build context", rel)
		}
	}

	// main.version is the string -X stamps.
	if !mainDeclaresVersion(t) {
		t.Error("package main has no var version for -X main.version to stamp")
	}
}

// mainDeclaresVersion reports whether a non-test file of package main at
// the repository root declares a package-level var named version.
func mainDeclaresVersion(t *testing.T) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name != "main" {
			continue
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					if id.Name == "version" {
						return true
					}
				}
			}
		}
	}
	return false
}

// dockerignoredDirs returns the top-level folders .dockerignore leaves out.
func dockerignoredDirs(t *testing.T) map[string]bool {
	t.Helper()
	dirs := map[string]bool{}
	for _, line := range strings.Split(readFile(t, ".dockerignore"), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.ContainsAny(line, "*!") {
			continue
		}
		dirs[strings.Trim(line, "/")] = true
	}
	return dirs
}
