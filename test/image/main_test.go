package image

import (
	"testing"

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
	apiserver.Main(m, &env, apiserver.Suite{Options: apiserver.Options{StaleVersions: true}, Helm: &helmBin})
}
