package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/watchgate/watchgate/test/apiserver"
)

// watchgate is bin/watchgate running in its own process.
type watchgate struct {
	cmd                  *exec.Cmd
	proxyURL, metricsURL string
	pprofURL             string // its /debug/pprof/ server
	done                 chan struct{}
}

// podName is the replica name the demo's watchgate writes its status as.
const podName = "watchgate-demo-0"

func startWatchgate(ctx context.Context, binary, kubeconfig string) (*watchgate, error) {
	var addrs [4]string
	for i := range addrs {
		a, err := apiserver.FreeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	cmd := exec.Command(binary, "--kubeconfig", kubeconfig,
		"--proxy-bind-address", addrs[0], "--metrics-bind-address", addrs[1], "--metrics-secure=false", "--health-probe-bind-address", addrs[2], "--pprof-bind-address", addrs[3],
		"--pod-name", podName, "--shutdown-grace-period", "1s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM} // never outlive the demo
	logs, err := os.Create(filepath.Join(os.TempDir(), "watchgate-demo.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (run `make build`): %w", binary, err)
	}
	w := &watchgate{cmd: cmd, proxyURL: "https://" + addrs[0], metricsURL: "http://" + addrs[1] + "/metrics", pprofURL: "http://" + addrs[3] + "/debug/pprof/",
		done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logs.Close(); close(w.done) }()
	fmt.Println("    logs:", logs.Name())
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + addrs[2] + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return w, nil
			}
		}
		select {
		case <-w.done:
			return nil, fmt.Errorf("watchgate exited before it was ready; see %s", logs.Name())
		case <-ctx.Done():
			w.stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			w.stop()
			return nil, fmt.Errorf("watchgate not ready within 60s; see %s", logs.Name())
		}
	}
}

func (w *watchgate) stop() {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.done
	}
}

// profileCPU saves a CPU profile of watchgate over d into file.
func (w *watchgate) profileCPU(ctx context.Context, d time.Duration, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%sprofile?seconds=%d", w.pprofURL, int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: d + 30*time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("CPU profile: HTTP %d", resp.StatusCode)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
