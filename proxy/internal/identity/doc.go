// Package identity finds whose budget a request spends:
// WithBudgetIdentity honours Impersonate-* headers (read exactly as
// kube-apiserver's impersonation filter reads them:
// ImpersonationRequest) only when a SubjectAccessReview (CachedAuthorizer,
// within proxy/internal/review's budgets) says the caller may impersonate
// that user, those groups, extras and UID, and only for requests a budget
// charges (ChargesOf). Otherwise the budget identity is the caller.
//
// It never refuses a request for its headers' sake: the API server
// answers 403 itself. proxy's chain runs it after classification.
package identity
