package image

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/watchgate/watchgate/test/apiserver"
)

var (
	env  *apiserver.Env
	root = apiserver.RepoRoot()
	// helmBin is the helm pinned in hack/tools/go.mod, built by TestMain.
	helmBin string
)

// TestMain builds the pinned helm and starts a test bed whose resource
// versions go stale within seconds (no watch cache, etcd compacted every
// 5 s).
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "watchgate-image-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	// Keep helm away from the user's own helm configuration and cache.
	for _, v := range []string{"HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME"} {
		os.Setenv(v, filepath.Join(tmp, strings.ToLower(v)))
	}
	helmBin = filepath.Join(tmp, "helm")
	build := exec.Command("go", "build", "-modfile="+filepath.Join(root, "hack", "tools", "go.mod"), "-o", helmBin, "helm.sh/helm/v3/cmd/helm")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build helm from hack/tools/go.mod: %v\n%s", err, out)
		return 1
	}
	ctrllog.SetLogger(logr.Discard())
	return apiserver.Main(m, apiserver.Options{StaleVersions: true}, &env)
}
