// Package e2e tests watchgate's proxy end to end: a proxy.Server started in
// process in front of the test bed's real kube-apiserver (no watch cache,
// etcd compacted every 5 s, so that versions go stale in seconds), with a
// real ratelimit engine and a hand-built policy, and real clients (client-go
// informers in JSON and protobuf, raw HTTP where the wire matters). What
// reached the API server is read from its own metrics.
//
// The load runs (build tag load, `make load` and `make load-hostile`) run
// bin/watchgate as a separate process instead, each on a control plane of
// its own. `make load` (load_test.go) compares it with a bare reverse proxy
// (testdata/bareproxy): load_proxies_test.go starts and measures the
// proxies, load_clients_test.go drives the load client (testdata/loadclient
// processes), load_events_test.go writes the events the watches receive,
// load_measure_test.go is the side-by-side run, load_hold_test.go the held
// replica, and load_report_test.go the settings and the BENCHMARKS.md block
// both runs share. LOAD.md describes the method of both runs.
package e2e
