// Package apiserver starts the test bed every integration and end-to-end test
// of watchgate runs against: a real kube-apiserver and etcd, built from pinned
// sources by hack/testbin.sh and started through controller-runtime's envtest.
//
// One control plane per test package, started in TestMain, which is one
// call:
//
//	func TestMain(m *testing.M) {
//		apiserver.Main(m, &env, apiserver.Suite{Options: apiserver.Options{StaleVersions: true}})
//	}
//
// Main also sets controller-runtime's logger (silent unless
// WATCHGATE_TEST_LOG is set), builds the pinned helm when the Suite asks for
// it, and runs the Suite's Setup before the tests. Options select the
// stale-version scenario (no watch cache, etcd compacted every 5 s) and the
// CRDs to load. Env hands out admin and per-user clients,
// service accounts with real bearer tokens (TokenRequest), and reads the API
// server's own /metrics, so that tests can assert what reached it.
// Env.StartAggregated registers a small aggregated API server, served from
// the test process behind kube-apiserver's aggregator (aggregated.go), one
// of whose resources never completes a watch-list (kubernetes#140890); it
// counts the requests that reach it.
//
// For the tests that install the chart and run watchgate as its pod would
// (test/packaging, test/image): Suite.Helm (BuildHelm) builds the pinned
// helm and Helm runs it; LockedBuffer collects a process's output and
// WaitWhileRunning polls for a condition while the process lives. FreeAddr
// gives each server such a process starts a port of its own.
package apiserver
