package packaging

import (
	"strings"
	"testing"
)

// TestRecipesBudgetsAreValid dry-run applies every WatchBudget of
// docs/recipes.md, as TestOperatorDocsBudgetsAreValid does for the
// manual's examples.
func TestRecipesBudgetsAreValid(t *testing.T) {
	installPrerequisites(t)
	n := 0
	for _, b := range yamlBlocks(readFile(t, "docs/recipes.md")) {
		if !strings.Contains(b, "kind: WatchBudget") {
			continue
		}
		n++
		if _, err := dryRun(t, b); err != nil {
			t.Errorf("docs/recipes.md budget is invalid: %v\n%s", err, b)
		}
	}
	if n < 6 {
		t.Errorf("found %d WatchBudgets in docs/recipes.md, want at least 6 (one per recipe)", n)
	}
}
