// Package packaging tests what operators install: the Helm chart in
// charts/watchgate, the kustomize bases in config/ and the Dockerfile,
// against the real kube-apiserver of the test bed (package test/apiserver).
//
// Helm is the one pinned in hack/tools/go.mod (built once in TestMain);
// kubectl is the test bed's. The tests check:
//
//   - helm lint passes with the default values and with every file in
//     testdata/values-*.yaml;
//   - values.schema.json rejects unknown keys (a typo fails rendering), is
//     closed at every level, and every value is commented in values.yaml;
//   - the chart's CRD, ClusterRole and namespaced Role are the ones
//     controller-gen generates into config/
//     (charts/watchgate/hack/sync-generated.sh copies them); pods are
//     readable in the release namespace only;
//   - `helm template` and `kubectl kustomize config/default` (with each TLS
//     component) apply with server-side dry-run and strict field validation,
//     with no warning (the restricted Pod Security Standard included), once
//     the CRD is installed for real; and they install the same objects;
//     config/prometheus is the chart's ServiceMonitor and PrometheusRule;
//   - a real `helm install`, `helm upgrade` and `helm uninstall`: the budgets
//     come up through the hook, the generated certificate survives upgrades,
//     the CRD survives uninstall;
//   - the binary, run with the installed Deployment's arguments and
//     environment as the chart's ServiceAccount (the test plays the kubelet),
//     turns ready, takes the Lease, writes its status entry and serves a
//     watch through the proxy with the chart's certificate: the chart's RBAC
//     is enough for the code;
//   - with injection.separateDeployment, the webhook and CA publisher run
//     in a Deployment of their own (--mode=injector) whose ServiceAccount
//     alone holds the injector's rights, as the API server confirms;
//   - the Dockerfile builds what the image promises from a build context
//     that holds every package the binary needs, and the same image as
//     `make image` (hack/image -describe): the same base files on scratch,
//     user, entrypoint, ports, environment, labels and build flags; the
//     chart's image values and Artifact Hub annotations name that image and
//     its platforms (the image itself is run in package test/image);
//   - the WatchBudget examples of docs/operators.md pass validation, its
//     contents list names every section and every heading of the Security
//     model, every link to a section in README.md, BENCHMARKS.md and docs/
//     finds its heading, and every table of BENCHMARKS.md names its commit
//     (docs_test.go);
//   - docs/operators.md's metric table lists every metric the code defines,
//     with its labels, and nothing else (metrics_test.go);
//   - every query of the Grafana dashboard and every alert of the
//     PrometheusRule names only series and labels that /metrics serves,
//     the dashboard reads what each of its views needs, and
//     dashboard.enabled renders it as a ConfigMap for Grafana's sidecar
//     (dashboard_test.go);
//   - the repository holds source only: no tracked file over 1 MiB, no
//     compiled program, no NUL bytes outside images, and .gitignore covers
//     what the Makefile and hack/ build (tree_test.go).
//
// The test bed has no cert-manager and no Prometheus Operator; the stand-in
// CRDs in testdata/stub-crds.yaml accept any spec of their kinds, so objects
// of those kinds are only checked for apiVersion, kind and metadata.
package packaging
