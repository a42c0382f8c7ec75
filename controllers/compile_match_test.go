package controllers

import (
	"cmp"
	"testing"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

// staleVersions.match reaches the engine's budget as is; unset, the engine
// fills in AtOrBelow, as the CRD's default does.
func TestToBudgetMapsStaleMatch(t *testing.T) {
	for match, want := range map[v1alpha1.StaleMatch]ratelimit.StaleMatch{
		v1alpha1.StaleMatchExact:     ratelimit.StaleMatchExact,
		v1alpha1.StaleMatchAtOrBelow: ratelimit.StaleMatchAtOrBelow,
		"":                           "",
	} {
		wb := &v1alpha1.WatchBudget{}
		wb.Name = "match-" + string(match)
		wb.Spec.StaleVersions.Match = match
		b, err := ToBudget(wb)
		if err != nil {
			t.Fatalf("%q: %v", match, err)
		}
		if b.StaleVersions.Match != want {
			t.Errorf("%q: Match = %q, want %q", match, b.StaleVersions.Match, want)
		}
		p, err := ratelimit.NewPolicy([]ratelimit.Budget{b})
		if err != nil {
			t.Fatal(err)
		}
		compiled := cmp.Or(want, ratelimit.StaleMatchAtOrBelow)
		if got := p.Budgets()[0].StaleVersions.Match; got != compiled {
			t.Errorf("%q: compiled Match = %q, want %q", match, got, compiled)
		}
	}
	wb := &v1alpha1.WatchBudget{}
	wb.Name = "match-bad"
	wb.Spec.StaleVersions.Match = "Below"
	if b, err := ToBudget(wb); err == nil {
		if _, err := ratelimit.NewPolicy([]ratelimit.Budget{b}); err == nil {
			t.Errorf("match %q accepted", wb.Spec.StaleVersions.Match)
		}
	}
}
