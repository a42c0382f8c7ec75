// Package inject tests pod injection (package inject) against a real
// kube-apiserver that calls the webhook (envtest's webhook install options,
// with config/webhook/manifests.yaml) and has its ServiceAccount admission
// plugin on, as in a real cluster, so that pods arrive at the webhook with
// their kube-api-access volume. The client a routed pod would run is
// client-go configured as rest.InClusterConfig would configure it from the
// pod's env and projected files, talking to a real watchgate proxy.
package inject
