package packaging

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
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

// TestOperatorDocsContentsListsEverySection reads the Contents list at
// the top of docs/operators.md: it names every section (## heading) in
// the document's order, numbered 1, 2, 3… without a gap or a repeat, and
// every ### heading of the Security model, so that each promise there can
// be linked and found.
func TestOperatorDocsContentsListsEverySection(t *testing.T) {
	doc := readFile(t, "docs/operators.md")
	_, contents, ok := strings.Cut(doc, "\nContents:\n")
	if !ok {
		t.Fatal(`docs/operators.md has no "Contents:" list`)
	}
	contents, _, _ = strings.Cut(contents, "\n## ")
	numbered := regexp.MustCompile(`^(\d+)\. \[(.+)\]\(#([^)]+)\)$`)
	nested := regexp.MustCompile(`^\s+- \[(.+)\]\(#([^)]+)\)$`)
	var listed, listedSecurity []string
	for _, line := range strings.Split(contents, "\n") {
		if m := numbered.FindStringSubmatch(line); m != nil {
			if want := strconv.Itoa(len(listed) + 1); m[1] != want {
				t.Errorf("contents: %q is numbered %s, want %s", m[2], m[1], want)
			}
			listed = append(listed, m[3])
		} else if m := nested.FindStringSubmatch(line); m != nil {
			listedSecurity = append(listedSecurity, m[2])
		}
	}
	var sections, security []string
	current := ""
	for _, h := range headings(doc) {
		switch h.level {
		case 2:
			sections = append(sections, h.anchor)
			current = h.text
		case 3:
			if current == "Security model" {
				security = append(security, h.anchor)
			}
		}
	}
	if !slices.Equal(listed, sections) {
		t.Errorf("contents list the sections\n%q\nthe document has\n%q", listed, sections)
	}
	if len(security) < 5 {
		t.Errorf("the Security model has %d ### headings, want each of its promises under one", len(security))
	}
	if !slices.Equal(listedSecurity, security) {
		t.Errorf("contents list the Security model's headings\n%q\nit has\n%q", listedSecurity, security)
	}
}

// TestDocsLinksToSectionsResolve checks every link to a section (#anchor,
// or other.md#anchor) in README.md, BENCHMARKS.md and docs/: the heading
// exists, so that moving or renaming a section cannot leave a dead link.
func TestDocsLinksToSectionsResolve(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"), filepath.Join(root, "BENCHMARKS.md"))
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v", err)
		}
		a := map[string]bool{}
		for _, h := range headings(string(b)) {
			a[h.anchor] = true
		}
		anchors[path] = a
		return a
	}
	link := regexp.MustCompile(`\]\(([^)#\s]*)#([^)\s]+)\)`)
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := f
			if m[1] != "" {
				if strings.Contains(m[1], "://") {
					continue
				}
				target = filepath.Join(filepath.Dir(f), m[1])
			}
			n++
			if !anchorsOf(target)[m[2]] {
				rel, _ := filepath.Rel(root, f)
				t.Errorf("%s: link %s#%s: no such heading", rel, m[1], m[2])
			}
		}
	}
	if n < 10 {
		t.Errorf("found %d links to sections, want the contents list's at least", n)
	}
}

// heading is a Markdown heading with its GitHub anchor.
type heading struct {
	level        int
	text, anchor string
}

// headings lists the ATX headings of a Markdown document outside fenced
// code blocks, with the anchors GitHub gives them: lower case, spaces to
// hyphens, punctuation dropped, "-1", "-2"… after a repeat.
func headings(md string) []heading {
	var hs []heading
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if fenced || level == 0 || !strings.HasPrefix(line[level:], " ") {
			continue
		}
		text := strings.TrimSpace(line[level:])
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		anchor := b.String()
		if k := seen[anchor]; k > 0 {
			seen[anchor]++
			anchor = fmt.Sprintf("%s-%d", anchor, k)
		} else {
			seen[anchor] = 1
		}
		hs = append(hs, heading{level: level, text: text, anchor: anchor})
	}
	return hs
}

// TestBenchmarkTablesNameTheirCommit checks that every table of
// BENCHMARKS.md (after its index) names the commit its figures were
// measured on: in a column of its own, or between the table and the
// heading or harness-written block it belongs to.
func TestBenchmarkTablesNameTheirCommit(t *testing.T) {
	commit := regexp.MustCompile(`commit [0-9a-f]{7,40}\b`)
	lines := strings.Split(readFile(t, "BENCHMARKS.md"), "\n")
	since := -1 // the line of the last heading or begin marker, -1 before the first section
	tables := 0
	for i, line := range lines {
		switch {
		case strings.HasPrefix(line, "## "), strings.HasPrefix(line, "<!--") && strings.Contains(line, "begin"):
			since = i
		case strings.HasPrefix(line, "|") && (i == 0 || !strings.HasPrefix(lines[i-1], "|")) && since >= 0:
			tables++
			if strings.Contains(line, "commit") {
				continue
			}
			if !commit.MatchString(strings.Join(lines[since:i], "\n")) {
				t.Errorf("BENCHMARKS.md:%d: the table %q names no commit", i+1, line)
			}
		}
	}
	if tables < 10 {
		t.Errorf("found %d tables in BENCHMARKS.md, want every harness's", tables)
	}
}
