package packaging

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestDockerfile reads the Dockerfile (there is no container engine in the
// test environment) for what the image promises: a Go 1.26 builder, a
// static, trimmed, version-stamped binary on scratch, as non-root 65532.
// And it checks the build context: .dockerignore must not leave out any
// package the binary is built from, nor what the base files are written
// from (hack/image, LICENSE), and main.version must exist for -X to stamp.
func TestDockerfile(t *testing.T) {
	df := parseDockerfile(t)
	if len(df.stages) != 2 || !strings.Contains(df.stages[0].from, "golang:1.26 ") {
		t.Fatalf("want a golang:1.26 builder stage and a final stage, got %d stages", len(df.stages))
	}
	if final := df.final(); final.from != "scratch" {
		t.Errorf("final stage FROM %q, want scratch: the base files come from hack/image, as in `make image`", final.from)
	}
	if user := df.final().last("USER"); user != "65532:65532" {
		t.Errorf("USER %q, want 65532:65532 (numeric, so runAsNonRoot can verify it)", user)
	}
	build := df.stages[0].matching("RUN", "go build")
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}", "go build"} {
		if !strings.Contains(build, want) {
			t.Errorf("the build step lacks %q: %s", want, build)
		}
	}

	// Every package of the module the binary imports must be in the build
	// context, and so must what the base files are written from.
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
	if ignored["LICENSE"] || ignored["hack"] && !strings.Contains(readFile(t, ".dockerignore"), "\n!hack/image/\n") {
		t.Error(".dockerignore leaves LICENSE or hack/image out of the build context; the base files are written from them")
	}

	// main.version is the string -X stamps.
	if !mainDeclaresVersion(t) {
		t.Error("package main has no var version for -X main.version to stamp")
	}
}

// imageDescription is what `go run ./hack/image -describe` prints: the
// content and config every image `make image` builds holds, with the
// Dockerfile's build arguments for what varies.
type imageDescription struct {
	Repository   string            `json:"repository"`
	Platforms    []string          `json:"platforms"`
	User         string            `json:"user"`
	Entrypoint   []string          `json:"entrypoint"`
	ExposedPorts []string          `json:"exposedPorts"`
	Env          []string          `json:"env"`
	Labels       map[string]string `json:"labels"`
	GoBuild      struct {
		Env  []string `json:"env"`
		Args []string `json:"args"`
	} `json:"goBuild"`
	Files []struct {
		Path string `json:"path"`
		Mode string `json:"mode"`
	} `json:"files"`
}

// describeImage runs hack/image -describe (compiling it the first time).
func describeImage(t *testing.T) imageDescription {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", ".", "-src", root, "-describe")
	cmd.Dir = filepath.Join(root, "hack", "image")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/image -describe: %v\n%s", err, stderr.String())
	}
	var d imageDescription
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatalf("hack/image -describe: %v\n%s", err, out)
	}
	return d
}

// TestDockerfileBuildsWhatMakeImageBuilds keeps the Dockerfile and
// hack/image (`make image`) in agreement: the base files written by
// hack/image itself into the FROM scratch stage, the binary where the
// entrypoint points, built with the same environment and flags, and the
// same user, environment, ports, entrypoint and labels. The Makefile's
// build target stamps the version the same way.
func TestDockerfileBuildsWhatMakeImageBuilds(t *testing.T) {
	d := describeImage(t)
	df := parseDockerfile(t)
	builder, final := df.stages[0], df.final()

	if run := builder.matching("RUN", "-rootfs"); !strings.Contains(run, "cd hack/image && go run . -src /src -rootfs /out/rootfs") {
		t.Errorf("the builder does not write the base files with hack/image -rootfs /out/rootfs: %q", run)
	}
	if got := final.all("COPY"); !slices.Equal(got, []string{"--from=builder /out/rootfs/ /", "--from=builder /out/watchgate " + d.Entrypoint[0]}) {
		t.Errorf("the final stage copies %q; want the base files, then the binary at %s", got, d.Entrypoint[0])
	}
	build := builder.matching("RUN", "go build")
	for _, want := range d.GoBuild.Env {
		if !slices.Contains(strings.Fields(build), want) {
			t.Errorf("the build step does not set %s, as hack/image does: %s", want, build)
		}
	}
	args := slices.Clone(d.GoBuild.Args)
	for i, a := range args {
		if strings.Contains(a, " ") {
			args[i] = strconv.Quote(a)
		}
	}
	if want := "go " + strings.Join(args, " ") + " -o /out/watchgate ."; !strings.Contains(build, want) {
		t.Errorf("the build step is not hack/image's %q: %s", want, build)
	}
	ldflags := d.GoBuild.Args[slices.Index(d.GoBuild.Args, "-ldflags")+1]
	if want := "LDFLAGS := " + strings.ReplaceAll(ldflags, "${VERSION}", "$(VERSION)") + "\n"; !strings.Contains(readFile(t, "Makefile"), want) {
		t.Errorf("the Makefile's build target does not stamp the binary as the image does: want %q", want)
	}

	if got := final.last("USER"); got != d.User {
		t.Errorf("USER %q, hack/image's %q", got, d.User)
	}
	var entrypoint []string
	if err := json.Unmarshal([]byte(final.last("ENTRYPOINT")), &entrypoint); err != nil || !slices.Equal(entrypoint, d.Entrypoint) {
		t.Errorf("ENTRYPOINT %s (%v), hack/image's %q", final.last("ENTRYPOINT"), err, d.Entrypoint)
	}
	if got := strings.Fields(final.last("EXPOSE")); !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(d.ExposedPorts))) {
		t.Errorf("EXPOSE %q, hack/image's %q", got, d.ExposedPorts)
	}
	if got := final.all("ENV"); !slices.Equal(got, d.Env) {
		t.Errorf("ENV %q, hack/image's %q", got, d.Env)
	}
	labels := map[string]string{}
	for _, l := range final.all("LABEL") {
		for _, m := range labelPair.FindAllStringSubmatch(l, -1) {
			labels[m[1]] = m[2]
		}
	}
	if !maps.Equal(labels, d.Labels) {
		t.Errorf("LABEL %v, hack/image's %v", labels, d.Labels)
	}
	for _, arg := range []string{"VERSION", "REVISION", "CREATED"} {
		if !slices.ContainsFunc(final.all("ARG"), func(a string) bool { return strings.HasPrefix(a, arg+"=") }) {
			t.Errorf("the final stage does not declare ARG %s, which its labels use", arg)
		}
	}
	if docker := readFile(t, "Makefile"); !strings.Contains(docker, "--build-arg REVISION=") || !strings.Contains(docker, "--build-arg CREATED=") {
		t.Error("make docker-build does not pass REVISION and CREATED, so its labels would differ from make image's")
	}
}

// labelPair is one key="value" of a LABEL instruction.
var labelPair = regexp.MustCompile(`([a-z0-9.\-]+)="([^"]*)"`)

// TestChartNamesTheImage: the chart's image values and its Artifact Hub
// annotations name the image `make image` builds, for the platforms it
// builds; artifacthub.io/changes is a list Artifact Hub reads.
func TestChartNamesTheImage(t *testing.T) {
	d := describeImage(t)
	var chartYAML struct {
		AppVersion  string            `json:"appVersion"`
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "charts/watchgate/Chart.yaml")), &chartYAML); err != nil {
		t.Fatal(err)
	}
	var values struct {
		Image struct {
			Repository string `json:"repository"`
		} `json:"image"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "charts/watchgate/values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	if values.Image.Repository != d.Repository {
		t.Errorf("values.yaml image.repository %q, make image builds %q", values.Image.Repository, d.Repository)
	}

	var images []struct {
		Name      string   `json:"name"`
		Image     string   `json:"image"`
		Platforms []string `json:"platforms"`
	}
	if err := yaml.Unmarshal([]byte(chartYAML.Annotations["artifacthub.io/images"]), &images); err != nil {
		t.Fatalf("artifacthub.io/images: %v", err)
	}
	if want := d.Repository + ":" + chartYAML.AppVersion; len(images) != 1 || images[0].Image != want || images[0].Name == "" ||
		!slices.Equal(images[0].Platforms, d.Platforms) {
		t.Errorf("artifacthub.io/images = %+v, want one named image %s for %v", images, want, d.Platforms)
	}

	var changes []struct {
		Kind        string `json:"kind"`
		Description string `json:"description"`
	}
	if err := yaml.Unmarshal([]byte(chartYAML.Annotations["artifacthub.io/changes"]), &changes); err != nil {
		t.Fatalf("artifacthub.io/changes: %v", err)
	}
	if len(changes) == 0 {
		t.Error("artifacthub.io/changes is empty")
	}
	for _, c := range changes {
		if !slices.Contains([]string{"added", "changed", "deprecated", "removed", "fixed", "security"}, c.Kind) || c.Description == "" {
			t.Errorf("artifacthub.io/changes entry %+v: want a kind Artifact Hub knows and a description", c)
		}
	}
}

// dockerfile is the Dockerfile's instructions by stage.
type dockerfile struct{ stages []stage }

type stage struct {
	from         string
	instructions [][2]string // instruction, its arguments
}

func (d dockerfile) final() stage { return d.stages[len(d.stages)-1] }

// all returns the arguments of every instruction of the kind, in order.
func (s stage) all(kind string) []string {
	var out []string
	for _, in := range s.instructions {
		if in[0] == kind {
			out = append(out, in[1])
		}
	}
	return out
}

func (s stage) last(kind string) string {
	all := s.all(kind)
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1]
}

// matching returns the first instruction of the kind whose arguments hold
// substr, or "".
func (s stage) matching(kind, substr string) string {
	for _, a := range s.all(kind) {
		if strings.Contains(a, substr) {
			return a
		}
	}
	return ""
}

// parseDockerfile splits the Dockerfile into stages of instructions, with
// continuation lines joined and comments dropped.
func parseDockerfile(t *testing.T) dockerfile {
	t.Helper()
	var d dockerfile
	var lines []string
	for _, l := range strings.Split(readFile(t, "Dockerfile"), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		lines = append(lines, l)
	}
	text := strings.ReplaceAll(strings.Join(lines, "\n"), "\\\n", " ")
	for _, l := range strings.Split(text, "\n") {
		kind, args, _ := strings.Cut(strings.TrimSpace(l), " ")
		args = strings.Join(strings.Fields(args), " ")
		switch kind {
		case "":
		case "FROM":
			d.stages = append(d.stages, stage{from: args})
		default:
			if len(d.stages) == 0 {
				continue // ARG before the first FROM
			}
			s := &d.stages[len(d.stages)-1]
			s.instructions = append(s.instructions, [2]string{kind, args})
		}
	}
	if len(d.stages) == 0 {
		t.Fatal("the Dockerfile has no FROM")
	}
	return d
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
