// Package v1alpha1 is the watchgate.io/v1alpha1 API: the WatchBudget, which
// tells the watchgate proxy how many watches (and lists) each identity may
// open, how fast, and what to do with clients whose watches keep dying or
// that resubscribe with a resourceVersion the API server has already
// declared too old.
//
// The Go types are the source of truth: controller-gen renders the CRD
// (config/crd/bases), with its OpenAPI validation, CEL rules, defaults and
// printer columns, from the markers next to each field, the deepcopy code
// (zz_generated.deepcopy.go) and the typed apply configurations for
// server-side apply (applyconfiguration/, which the controllers write status
// with). Run `make manifests generate` after every change; a test fails when
// the committed files are stale.
//
// +kubebuilder:object:generate=true
// +kubebuilder:ac:generate=true
// +groupName=watchgate.io
package v1alpha1
