package packaging

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// metricsDoc is the one list of watchgate's metrics.
const metricsDoc = "docs/operators.md"

// Every metric the product's code defines is in the metric table of
// docs/operators.md with exactly its labels, and the table lists nothing
// else: the table is the one list, and it cannot drift from the code.
func TestMetricTableListsEveryMetric(t *testing.T) {
	code := definedMetrics(t)
	if len(code) < 10 {
		t.Fatalf("found %d metric definitions in the code, want all of them: %v", len(code), code)
	}
	doc := documentedMetrics(t, readFile(t, metricsDoc))
	for name, m := range code {
		got, ok := doc[name]
		switch {
		case !ok:
			t.Errorf("%s (labels %v) is not in the metric table of %s", name, m.labels, metricsDoc)
		case !slices.Equal(got, m.labels):
			t.Errorf("%s: %s lists labels %v, the code has %v", name, metricsDoc, got, m.labels)
		}
	}
	for name := range doc {
		if _, ok := code[name]; !ok {
			t.Errorf("%s is in the metric table of %s but no code defines it", name, metricsDoc)
		}
	}
}

// definedMetric is what the code says of one metric.
type definedMetric struct {
	labels []string
	// histogram: exposed as the series <name>_bucket (with the label le),
	// <name>_sum and <name>_count.
	histogram bool
}

// definedMetrics finds every prometheus.NewX(XOpts{Name: "…"}, []string{…})
// in the product's non-test Go files (not under hack/ or test/) and returns
// each metric's labels and kind.
func definedMetrics(t *testing.T) map[string]definedMetric {
	t.Helper()
	metrics := map[string]definedMetric{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (rel == "hack" || rel == "test" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !strings.HasPrefix(sel.Sel.Name, "New") {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "prometheus" {
				return true
			}
			opts, ok := call.Args[0].(*ast.CompositeLit)
			if !ok {
				return true
			}
			name := ""
			for _, e := range opts.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				switch key := kv.Key.(*ast.Ident).Name; key {
				case "Name":
					name = stringLiteral(t, fset, kv.Value)
				case "Namespace", "Subsystem", "ConstLabels":
					t.Errorf("%s: %s in a metric's options: this test reads Name only", fset.Position(kv.Pos()), key)
				}
			}
			if name == "" {
				t.Errorf("%s: a metric without a literal Name", fset.Position(call.Pos()))
				return true
			}
			labels := []string{}
			if strings.HasSuffix(sel.Sel.Name, "Vec") {
				if len(call.Args) < 2 {
					t.Errorf("%s: %s without labels", fset.Position(call.Pos()), name)
					return true
				}
				list, ok := call.Args[1].(*ast.CompositeLit)
				if !ok {
					t.Errorf("%s: %s's labels are not a literal []string", fset.Position(call.Pos()), name)
					return true
				}
				for _, e := range list.Elts {
					labels = append(labels, stringLiteral(t, fset, e))
				}
			}
			if _, dup := metrics[name]; dup {
				t.Errorf("%s: %s is defined twice", fset.Position(call.Pos()), name)
			}
			metrics[name] = definedMetric{labels: labels, histogram: strings.HasPrefix(sel.Sel.Name, "NewHistogram")}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return metrics
}

func stringLiteral(t *testing.T, fset *token.FileSet, e ast.Expr) string {
	t.Helper()
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		t.Errorf("%s: not a string literal", fset.Position(e.Pos()))
		return ""
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil {
		t.Errorf("%s: %v", fset.Position(e.Pos()), err)
	}
	return s
}

// documentedMetrics reads the table that starts with "| Metric | Labels |":
// the first cell names one or more metrics in backquotes, the second their
// labels, separated by commas, each optionally followed by its values in
// parentheses, or "—" for none.
func documentedMetrics(t *testing.T, md string) map[string][]string {
	t.Helper()
	metrics := map[string][]string{}
	in := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| Metric | Labels |") {
			if in || len(metrics) > 0 {
				t.Fatalf("%s has two metric tables", metricsDoc)
			}
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 || strings.HasPrefix(strings.TrimSpace(cells[0]), "---") {
			continue
		}
		labels := labelNames(cells[1])
		for _, name := range strings.Split(cells[0], ",") {
			name = strings.Trim(strings.TrimSpace(name), "`")
			if _, dup := metrics[name]; dup {
				t.Errorf("%s lists %s twice", metricsDoc, name)
			}
			metrics[name] = labels
		}
	}
	if len(metrics) == 0 {
		t.Fatalf("%s has no table that starts with \"| Metric | Labels |\"", metricsDoc)
	}
	return metrics
}

// labelNames reads "verb, decision (`allow`, `reject`), reason" as
// [verb decision reason], and "—" as none.
func labelNames(cell string) []string {
	labels := []string{}
	depth, start := 0, 0
	flush := func(s string) {
		s = strings.TrimSpace(s)
		if i := strings.IndexAny(s, " ("); i >= 0 {
			s = s[:i]
		}
		if s != "" && s != "—" {
			labels = append(labels, s)
		}
	}
	for i, r := range cell {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				flush(cell[start:i])
				start = i + 1
			}
		}
	}
	flush(cell[start:])
	return labels
}

func TestLabelNames(t *testing.T) {
	for cell, want := range map[string][]string{
		" verb, decision (`allow`, `reject`, `dryrun-reject`), reason, budget, enforcement ": {"verb", "decision", "reason", "budget", "enforcement"},
		" — ":                                 {},
		" review (`token`, `impersonation`) ": {"review"},
		" result ":                            {"result"},
	} {
		if got := labelNames(cell); !slices.Equal(got, want) {
			t.Errorf("labelNames(%q) = %v, want %v", cell, got, want)
		}
	}
}
