package proxy

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/watchgate/watchgate/proxy/internal/review"
)

// docs/architecture.md's "One request" walks the steps in chain.go's
// order, one numbered heading per step, numbered from 1.
func TestArchitectureWalksTheChainInOrder(t *testing.T) {
	doc, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, walk, ok := strings.Cut(string(doc), "\n## One request\n")
	if !ok {
		t.Fatal(`docs/architecture.md has no "## One request" section`)
	}
	walk, _, _ = strings.Cut(walk, "\n## ")
	item := regexp.MustCompile(`(?m)^(\d+)\. \*\*(.+?)\.\*\*`)
	var inDoc []string
	for i, m := range item.FindAllStringSubmatch(walk, -1) {
		if n, _ := strconv.Atoi(m[1]); n != i+1 {
			t.Errorf("step %q is numbered %d, want %d", m[2], n, i+1)
		}
		inDoc = append(inDoc, m[2])
	}
	var inChain []string
	for _, s := range steps(nil, nil, review.FailClosed, nil, nil, nil) {
		inChain = append(inChain, s.name)
	}
	if !slices.Equal(inDoc, inChain) {
		t.Errorf("docs/architecture.md walks\n\t%q\nchain.go's steps are\n\t%q", inDoc, inChain)
	}
}
