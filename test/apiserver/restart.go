package apiserver

import (
	"errors"
	"os"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// restartable gives te's kube-apiserver a certificate directory of its own when
// opts.Restartable, and returns it ("" otherwise). envtest removes a
// directory it created itself when kube-apiserver stops, and with it the
// serving CA and the service-account signing key: a restarted API server
// would then reject every token and certificate handed out before.
func restartable(opts Options, te *envtest.Environment) (string, error) {
	if !opts.Restartable {
		return "", nil
	}
	dir, err := os.MkdirTemp("", "watchgate-apiserver-")
	if err != nil {
		return "", err
	}
	te.ControlPlane.GetAPIServer().CertDir = dir
	// With watches open kube-apiserver takes up to its 60s shutdown
	// timeout to stop: its HTTP server waits for the streams.
	te.ControlPlaneStopTimeout = 90 * time.Second
	return dir, nil
}

func removeCertDir(dir string) {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

// StopAPIServer stops kube-apiserver (SIGTERM, as a rolling restart does)
// and leaves etcd running. The control plane must have been started with
// Options.Restartable.
func (e *Env) StopAPIServer() error {
	if e.certDir == "" {
		return errors.New("StopAPIServer needs a control plane started with Options.Restartable")
	}
	return e.env.ControlPlane.GetAPIServer().Stop()
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same address with the same etcd, certificates and service-account keys,
// and waits until it reports healthy.
func (e *Env) StartAPIServer() error {
	if e.certDir == "" {
		return errors.New("StartAPIServer needs a control plane started with Options.Restartable")
	}
	return e.env.ControlPlane.GetAPIServer().Start()
}
