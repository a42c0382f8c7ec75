// Package request is what the proxy's filters know about a request: its
// State in the request's context (the caller, the budget identity, the
// Classification, an admitted watch), filled in by each filter for the
// ones after it, and the classification itself (WithClassification:
// kube-apiserver's RequestInfoFactory, plus what a budget reads from the
// query: selectors, resourceVersion, sendInitialEvents, …). A new field
// read from the request's URL or query for a budget is added here.
//
// It decides nothing and answers nothing but a request it cannot
// classify. Every filter reads it; proxy/internal/authn, identity and
// admission write their fields.
package request
