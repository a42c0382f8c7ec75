package image

import (
	"fmt"
	"os"
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
	if helmBin, err = apiserver.BuildHelm(tmp); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctrllog.SetLogger(logr.Discard())
	return apiserver.Main(m, apiserver.Options{StaleVersions: true}, &env)
}
