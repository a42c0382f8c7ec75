package ratelimit

import (
	"testing"
	"time"
)

func TestBudgetImpersonationSelectsRequests(t *testing.T) {
	sa := Subject{Kind: ServiceAccount, Namespace: "*", Name: "*"}
	p, err := NewPolicy([]Budget{
		{Name: "agents", Precedence: 10, Impersonation: DirectOnly, Subjects: []Subject{sa}, Enforcement: Exempt},
		{Name: "people", Precedence: 20, Impersonation: ImpersonatedOnly, Enforcement: Exempt},
		{Name: "rest", Precedence: 30, Enforcement: Exempt},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(Options{Seed: 1})
	t0 := time.Unix(0, 0)
	e.SetPolicy(t0, p)
	for name, tc := range map[string]struct {
		user         string
		impersonated bool
		want         string
	}{
		"a service account in its own name is an agent":   {"system:serviceaccount:cattle-system:cattle", false, "agents"},
		"an impersonated service account is not":          {"system:serviceaccount:cattle-impersonation-system:u-1", true, "people"},
		"an impersonated user is governed as a person":    {"alice", true, "people"},
		"a user in their own name falls to the catch-all": {"bob", false, "rest"},
	} {
		t.Run(name, func(t *testing.T) {
			d := e.Decide(t0, &Request{User: tc.user, Verb: VerbWatch, Resource: "pods", Impersonated: tc.impersonated})
			if d.Budget != tc.want {
				t.Errorf("budget %q, want %q", d.Budget, tc.want)
			}
		})
	}
	if _, err := NewPolicy([]Budget{{Name: "bad", Impersonation: "Sometimes"}}); err == nil {
		t.Errorf("NewPolicy accepted impersonation Sometimes")
	}
}
