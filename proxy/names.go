package proxy

import "github.com/watchgate/watchgate/proxy/internal/answer"

// DecisionHeader names the decision, its reason and the budget on every
// response to a request a budget governs or the watch guard refused, e.g.
//
//	X-Watchgate-Decision: allow; budget=agents
//	X-Watchgate-Decision: reject; reason=RateLimited; budget=agents; retry-after=2
//	X-Watchgate-Decision: dryrun-reject; reason=TooManyWatches; budget=agents
//	X-Watchgate-Decision: reject; reason=FairShare; retry-after=5
const DecisionHeader = answer.DecisionHeader
