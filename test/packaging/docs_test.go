package packaging

import (
	"strings"
	"testing"
)

// TestOperatorDocsBudgetsAreValid dry-run applies every WatchBudget example
// of docs/operators.md, so that the manual's examples keep passing the
// API server's validation as the API evolves.
func TestOperatorDocsBudgetsAreValid(t *testing.T) {
	installPrerequisites(t)
	blocks := yamlBlocks(readFile(t, "docs/operators.md"))
	n := 0
	for _, b := range blocks {
		if !strings.Contains(b, "kind: WatchBudget") {
			continue
		}
		n++
		if _, err := dryRun(t, b); err != nil {
			t.Errorf("docs/operators.md example is invalid: %v\n%s", err, b)
		}
	}
	if n < 3 {
		t.Errorf("found %d WatchBudget examples in docs/operators.md, want at least 3", n)
	}
}

// yamlBlocks returns the contents of the ```yaml fenced blocks of a
// Markdown document.
func yamlBlocks(md string) []string {
	var blocks []string
	var cur *strings.Builder
	for _, line := range strings.Split(md, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(line) == "```yaml":
			cur = &strings.Builder{}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	return blocks
}
