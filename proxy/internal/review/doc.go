// Package review is how the proxy asks the API server about a caller
// without letting callers flood it: answers of TokenReviews and
// SubjectAccessReviews cached (Cache: positive and negative, bounded,
// one review in flight per key), sent within a Budget (a shared rate and
// one per requester, fair, with lanes for trusted and recently valid
// callers) and a concurrency limit; and the FailurePolicy that says what a
// request gets when its review cannot be had (429 when throttled, 503
// under FailClosed, forwarded and charged to an UnreviewedCaller under
// FailOpen).
//
// It does not say who a caller is or what it may do: authn (tokens),
// identity (impersonation) and top (access to the top endpoint) use it
// for their reviews.
package review
