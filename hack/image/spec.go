package main

import (
	"encoding/json"
	"io"
	"time"
)

// What every platform's image is. The Dockerfile says the same (a test in
// test/packaging compares it with describe's output).
const (
	// binaryPath is where the binary sits, and the entrypoint.
	binaryPath = "/watchgate"
	// imageUser is distroless's "nonroot" (65532), numeric so that
	// runAsNonRoot can check it without reading /etc/passwd.
	imageUser = "65532:65532"
	// defaultRepository is the image's name without a tag; the chart's
	// image.repository.
	defaultRepository = "ghcr.io/watchgate/watchgate"
)

// defaultPlatforms are the platforms `make image` builds.
var defaultPlatforms = []string{"linux/amd64", "linux/arm64"}

// exposedPorts: 8443 the proxy (HTTPS), 8080 /metrics, 8081 /healthz and
// /readyz.
var exposedPorts = []string{"8443/tcp", "8080/tcp", "8081/tcp"}

// imageEnv is the environment of the image's config. BuildKit gives a FROM
// scratch image this PATH; stating it keeps the two builds identical.
var imageEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// labels are the image's config labels and its manifests' annotations, after
// the OCI annotations convention
// (https://github.com/opencontainers/image-spec/blob/main/annotations.md).
func labels(version, revision string, created time.Time) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "watchgate",
		"org.opencontainers.image.description": "Watch budgets in front of kube-apiserver",
		"org.opencontainers.image.source":      "https://github.com/watchgate/watchgate",
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.revision":    revision,
		"org.opencontainers.image.created":     created.UTC().Format(time.RFC3339),
	}
}

// goBuildEnv and goBuildArgs build the binary: the Makefile's `build`
// target's flags, plus -buildvcs=false, since a binary that records the
// checkout's state (one untracked file sets vcs.modified) would differ
// between two clones of the same commit (the revision is in the labels and
// the SBOM instead). The environment pins what would change the binary:
// no cgo, no GOFLAGS from the caller, each architecture's baseline
// instruction set.
var goBuildEnv = []string{"CGO_ENABLED=0", "GOFLAGS=", "GOAMD64=v1", "GOARM64=v8.0"}

func goBuildArgs(version string) []string {
	return []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w -X main.version=" + version}
}

// description is describe's output.
type description struct {
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
	// Files are the base files (rootfs.go): path, octal mode (with the
	// sticky bit as 1000, a folder ends in /), SHA-256 of a file's content.
	Files []describedFile `json:"files"`
}

type describedFile struct {
	Path   string `json:"path"`
	Mode   string `json:"mode"`
	SHA256 string `json:"sha256,omitempty"`
}

// describe writes the image's fixed content as JSON, with the values that
// vary between builds as the Dockerfile's build arguments: ${VERSION},
// ${REVISION} and ${CREATED}.
func describe(w io.Writer, base []entry) error {
	var d description
	d.Repository = defaultRepository
	d.Platforms = defaultPlatforms
	d.User = imageUser
	d.Entrypoint = []string{binaryPath}
	d.ExposedPorts = exposedPorts
	d.Env = imageEnv
	d.Labels = labels("${VERSION}", "${REVISION}", time.Time{})
	d.Labels["org.opencontainers.image.created"] = "${CREATED}"
	d.GoBuild.Env = goBuildEnv
	d.GoBuild.Args = goBuildArgs("${VERSION}")
	for _, e := range base {
		d.Files = append(d.Files, e.describe())
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(d)
}
