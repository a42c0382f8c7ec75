package controllers

import (
	"time"

	"github.com/watchgate/watchgate/ratelimit"
)

// Engine is what the controllers need of *ratelimit.Engine: a policy to
// swap in and figures to report.
type Engine interface {
	// SetPolicy swaps the policy atomically, keeping accrued state.
	SetPolicy(now time.Time, p *ratelimit.Policy)
	// Stats returns live figures for each budget of the current policy.
	Stats() map[string]ratelimit.BudgetStats
}

var _ Engine = (*ratelimit.Engine)(nil)
