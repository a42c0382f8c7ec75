// Package identity finds whose budget a request spends:
// WithBudgetIdentity honours Impersonate-* headers (read exactly as
// kube-apiserver's impersonation filter reads them:
// ImpersonationRequest) only when kube-apiserver's own impersonation
// filter, legacy and constrained modes (servedAs), with its checks answered
// by SubjectAccessReviews (CachedAuthorizer, within proxy/internal/review's
// budgets), would serve the request as that user, and only for requests a
// budget charges (ChargesOf). Otherwise the budget identity is the caller.
//
// It never refuses a request for its headers' sake: the API server
// answers 403 itself. proxy's chain runs it after classification.
package identity
