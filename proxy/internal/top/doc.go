// Package top answers every path under /.watchgate/ (which kube-apiserver
// never serves), never forwarding one: GET /.watchgate/v1alpha1/top is
// the replica's identities ranked by rejections, opens or open watches per
// budget (api/top/v1alpha1's TopReport), for callers a SubjectAccessReview
// allows to get watchbudgets/status (cached, on the impersonation checks'
// review budget, fail closed), at most topReadsPerSecond reads a second
// per replica.
//
// It reads the engine's rankings and changes nothing. proxy's chain runs
// it right after authentication.
package top
