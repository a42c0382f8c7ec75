package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/watchgate/watchgate/test/apiserver"
)

// cl is the package's cluster; nil where no node can run (SkipReason).
var cl *Cluster

// Set up once for the package: helm, watchgate's image imported with the
// chart's default tag, and the programs the tests run in pods.
var (
	helm      string
	imageRef  string
	buildDir  string
	setupTime time.Duration
)

// agentImage is test/cluster/agent's image, stormImage
// test/cluster/storm's.
const (
	agentImage = "localhost/watchgate/agent:test"
	stormImage = "localhost/watchgate/storm:test"
)

func TestMain(m *testing.M) {
	// Stale versions in seconds, for the seed storm (storm_test.go).
	code := Main(m, &cl, Options{StaleVersions: true}, setup)
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func setup(c *Cluster) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var err error
	if buildDir, err = os.MkdirTemp("", "watchgate-cluster-build-"); err != nil {
		return err
	}
	if helm, err = apiserver.BuildHelm(filepath.Join(buildDir, "helm")); err != nil {
		return err
	}
	version, err := ChartAppVersion()
	if err != nil {
		return err
	}
	if imageRef, err = c.ImportWatchgateImage(ctx, buildDir, version); err != nil {
		return err
	}
	if err := c.ImportProgram(ctx, buildDir, "./test/cluster/agent", agentImage); err != nil {
		return fmt.Errorf("the agent's image: %w", err)
	}
	if err := c.ImportProgram(ctx, buildDir, "./test/cluster/storm", stormImage); err != nil {
		return fmt.Errorf("the storm's image: %w", err)
	}
	setupTime = time.Since(start)
	fmt.Fprintf(os.Stderr, "images and helm ready in %.1fs\n", setupTime.Seconds())
	return nil
}
