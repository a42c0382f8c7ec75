package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// forwarding is a port-forward from a port on 127.0.0.1 to a pod's port,
// through the API server, as `kubectl port-forward` opens it.
type forwarding struct {
	local uint16
	stop  func()
}

// forward opens a port-forward to the port of pod in namespace
// over SPDY with the kubeconfig's credentials (it needs create on
// pods/portforward), on a free local port; it fails when the API server
// or the pod's kubelet refuses it, or ctx ends first.
func (c *cluster) forward(ctx context.Context, namespace, pod string, port int) (*forwarding, error) {
	transport, upgrader, err := spdy.RoundTripperFor(c.cfg)
	if err != nil {
		return nil, err
	}
	u := c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return nil, err
	}
	// forwardErr is ForwardPorts' error, read once done is closed; after a
	// stop it is of no interest.
	var forwardErr error
	done := make(chan struct{})
	go func() { forwardErr = fw.ForwardPorts(); close(done) }()
	halt := func() { close(stop); <-done }
	select {
	case <-ready:
	case <-done:
		return nil, fmt.Errorf("port-forward to pod %s port %d: %w", pod, port, forwardErr)
	case <-ctx.Done():
		halt()
		return nil, fmt.Errorf("port-forward to pod %s port %d: %w", pod, port, ctx.Err())
	}
	ports, err := fw.GetPorts()
	if err != nil {
		halt()
		return nil, fmt.Errorf("port-forward to pod %s port %d: no local port: %w", pod, port, err)
	}
	if len(ports) != 1 {
		halt()
		return nil, fmt.Errorf("port-forward to pod %s port %d: %d local ports, want 1", pod, port, len(ports))
	}
	return &forwarding{local: ports[0].Local, stop: halt}, nil
}
