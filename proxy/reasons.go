package proxy

import "github.com/watchgate/watchgate/ratelimit"

// reasonTexts says, in a few words, why a request was rejected: the start
// of a 429's message and the note of the budget's Event. One table, so the
// client and the operator read the same words.
var reasonTexts = map[ratelimit.Reason]string{
	ratelimit.ReasonRateLimited:          "too many watch or list requests",
	ratelimit.ReasonTooManyWatches:       "too many open watches",
	ratelimit.ReasonBackingOff:           "watches keep failing, backing off",
	ratelimit.ReasonStaleResourceVersion: "resubscribing with a resourceVersion the API server declared too old",
	ratelimit.ReasonAggregateLimited:     "too many watches opened on behalf of others by the impersonating caller",
}

// ReasonText says why a request was rejected for reason r (the reason
// itself when it is not one of the engine's).
func ReasonText(r ratelimit.Reason) string {
	if t, ok := reasonTexts[r]; ok {
		return t
	}
	return string(r)
}
