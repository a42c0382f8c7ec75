// Package apiserver starts the test bed every integration and end-to-end test
// of watchgate runs against: a real kube-apiserver and etcd, built from pinned
// sources by hack/testbin.sh and started through controller-runtime's envtest.
//
// One control plane per test package, started in TestMain:
//
//	func TestMain(m *testing.M) {
//		os.Exit(apiserver.Main(m, apiserver.Options{StaleVersions: true}, &env))
//	}
//
// Options select the stale-version scenario (no watch cache, etcd compacted
// every 5 s) and the CRDs to load. Env hands out admin and per-user clients,
// service accounts with real bearer tokens (TokenRequest), and reads the API
// server's own /metrics, so that tests can assert what reached it.
//
// For the tests that install the chart and run watchgate as its pod would
// (test/packaging, test/image): BuildHelm builds the pinned helm and Helm
// runs it; LockedBuffer collects a process's output and WaitWhileRunning
// polls for a condition while the process lives.
package apiserver
