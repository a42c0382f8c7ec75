// Package cluster runs watchgate where operators run it: on a real one-node
// Kubernetes cluster (kubelet with containerd and runc, kube-proxy in
// iptables mode, CoreDNS, the control plane of the test bed), started by
// hack/cluster.sh once per test package, with images imported into the
// node's containerd instead of pulled.
//
// The helpers (Start, Main, the image builders) are for any package that
// needs a node; the tests beside them install the chart with its default
// values and `make image`'s image, exactly as docs/operators.md says, and
// check what only a node shows: pods admitted through the injection
// webhook on every replica, the published CA, the Services' names.
//
// A node needs Linux and root (containers, a bridge, iptables rules);
// elsewhere the tests skip, saying why on stderr and in every skip.
package cluster
