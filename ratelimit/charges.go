package ratelimit

// Charges reports whether the budget that governs r (see Engine.Decide)
// tracks it: false when no budget governs r or when the one that does is
// Exempt, so that whom r is charged to cannot change its decision. It
// reads only r's identity, resource and Impersonated. A nil Policy charges
// nothing.
func (p *Policy) Charges(r *Request) bool {
	i := p.matchRequest(r.User, r.Groups, r.Group, r.Resource, r.Namespace, r.Impersonated)
	return i >= 0 && p.budgets[i].Enforcement != Exempt
}
