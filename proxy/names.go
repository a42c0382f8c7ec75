package proxy

import (
	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/review"
)

// DecisionHeader names the decision, its reason and the budget on every
// response to a request a budget governs or the watch guard refused, e.g.
//
//	X-Watchgate-Decision: allow; budget=agents
//	X-Watchgate-Decision: reject; reason=RateLimited; budget=agents; retry-after=2
//	X-Watchgate-Decision: dryrun-reject; reason=TooManyWatches; budget=agents
//	X-Watchgate-Decision: reject; reason=FairShare; retry-after=5
const DecisionHeader = answer.DecisionHeader

// ReviewFailurePolicy says what the proxy does with a request whose token
// or impersonation it cannot review because the API server's TokenReview
// or SubjectAccessReview failed or took longer than ReviewTimeout.
type ReviewFailurePolicy = review.FailurePolicy

const (
	// FailClosed answers 503 ServiceUnavailable with a Status and
	// Retry-After; nothing is forwarded. The default.
	FailClosed = review.FailClosed
	// FailOpen forwards the request and charges it to an identity the
	// caller cannot otherwise spend (see review.FailOpen).
	FailOpen = review.FailOpen
)
