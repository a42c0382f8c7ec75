// Package e2e tests watchgate's proxy end to end: a proxy.Server started in
// process in front of the test bed's real kube-apiserver (no watch cache,
// etcd compacted every 5 s, so that versions go stale in seconds), with a
// real ratelimit engine and a hand-built policy, and real clients (client-go
// informers in JSON and protobuf, raw HTTP where the wire matters). What
// reached the API server is read from its own metrics.
package e2e
