// Package packaging tests what operators install: the Helm chart in
// charts/watchgate and the kustomize bases in config/, against the real
// kube-apiserver of the test bed (package test/apiserver).
//
// Every test renders with the helm pinned in hack/tools/go.mod (built once in
// TestMain) and the test bed's kubectl, then checks what the API server says
// about the result:
//
//   - helm lint passes with the default values and with every file in
//     testdata/values-*.yaml;
//   - values.schema.json rejects unknown keys (a typo fails rendering) and is
//     closed at every level;
//   - the chart's CRD and ClusterRole are the ones controller-gen generates
//     into config/ (charts/watchgate/hack/sync-generated.sh copies them);
//   - `helm template` and `kubectl kustomize config/default` apply with
//     server-side dry-run (strict field validation) once the CRD is installed
//     for real, and install the same objects;
//   - a real `helm install`, `helm upgrade` and `helm uninstall` against the
//     API server: the budgets come up through the hook, the generated
//     certificate survives upgrades, the CRD survives uninstall.
//
// The test bed has no cert-manager and no Prometheus Operator; the stub CRDs
// in testdata/stub-crds.yaml accept any spec of their kinds, so objects of
// those kinds are only checked for apiVersion, kind and metadata.
package packaging
