package packaging

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// valuesFiles are the non-default value sets every chart test also runs
// with.
func valuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "test", "packaging", "testdata", "values-*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/values-*.yaml: %v", err)
	}
	return files
}

func TestHelmLint(t *testing.T) {
	cases := map[string][]string{"default values": nil}
	for _, f := range valuesFiles(t) {
		cases[filepath.Base(f)] = []string{"--values", f}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			out, err := helm(t, append([]string{"lint", "--strict", "--kube-version", kubeVersion, chart}, args...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint did not pass:\n%s", out)
			}
		})
	}
}

// TestValuesSchemaRejectsTypos checks what values.schema.json is for: a
// misspelt or misplaced value fails `helm template` instead of being
// silently ignored.
func TestValuesSchemaRejectsTypos(t *testing.T) {
	if _, err := helm(t, "template", "wg", chart, "--kube-version", kubeVersion, "--set", "replicaCount=3"); err != nil {
		t.Fatalf("a valid --set failed: %v", err)
	}
	cases := map[string]struct {
		set  string
		want string // in helm's error
	}{
		"an unknown top-level key (replicas for replicaCount)": {"replicas=2", "replicas"},
		"an unknown nested key":                                {"service.sessionAfinity.enabled=false", "sessionAfinity"},
		"an unknown key inside a budget":                       {"defaultBudget.limits.watchesPerMinute=10", "watchesPerMinute"},
		"a string where a number belongs":                      {"replicaCount=two", "replicaCount"},
		"a value outside its enum":                             {"defaultBudget.enforcement=Enforced", "enforcement"},
		"a number outside its bounds":                          {"defaultBudget.precedence=0", "precedence"},
		"a malformed duration":                                 {"certManager.duration=90d", "duration"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := helm(t, "template", "wg", chart, "--kube-version", kubeVersion, "--set", c.set)
			if err == nil {
				t.Fatalf("--set %s rendered; want a schema error", c.set)
			}
			if !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("--set %s: want a schema error naming %q, got: %v", c.set, c.want, err)
			}
		})
	}
}

// TestInconsistentValuesFailRendering: values that are each valid but make
// no sense together fail `helm template` with a message that says why.
func TestInconsistentValuesFailRendering(t *testing.T) {
	cases := map[string]struct {
		set  []string
		want string
	}{
		"two replicas without leader election": {[]string{"leaderElection.enabled=false"}, "replicaCount: 1"},
		"an existing secret and cert-manager":  {[]string{"tls.existingSecret=mine", "certManager.enabled=true"}, "not both"},
		"a ServiceMonitor without the metrics Service": {
			[]string{"metrics.serviceMonitor.enabled=true", "metrics.service.enabled=false"}, "metrics.service.enabled"},
		"a termination grace shorter than the shutdown grace": {
			[]string{"shutdownGracePeriodSeconds=60", "terminationGracePeriodSeconds=60"}, "terminationGracePeriodSeconds"},
		"an exemption of nobody":                {[]string{"exemptBudget.subjects=null"}, "exemptBudget.subjects"},
		"no ServiceAccount name without create": {[]string{"serviceAccount.create=false"}, "serviceAccount.name"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			args := []string{"template", "wg", chart, "--kube-version", kubeVersion}
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			_, err := helm(t, args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("--set %v: want an error naming %q, got %v", c.set, c.want, err)
			}
		})
	}
}

// TestValuesSchemaIsClosed walks values.schema.json: every object the chart
// defines says what it accepts (additionalProperties false, or a schema for
// the values of a map). Only Kubernetes types passed through to the API
// server (which validates them) are open, and they say so.
func TestValuesSchemaIsClosed(t *testing.T) {
	var schema map[string]any
	if err := json.Unmarshal([]byte(readFile(t, "charts/watchgate/values.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	var open []string
	var walk func(path string, node map[string]any)
	walk = func(path string, node map[string]any) {
		if node["type"] == "object" {
			ap, has := node["additionalProperties"]
			desc, _ := node["description"].(string)
			switch {
			case has && ap == false:
			case has && isMap(ap):
			case strings.Contains(desc, "a Kubernetes type, passed through"):
			default:
				open = append(open, path)
			}
		}
		if props, ok := node["properties"].(map[string]any); ok {
			for k, v := range props {
				if m, ok := v.(map[string]any); ok {
					walk(path+"."+k, m)
				}
			}
		}
		if items, ok := node["items"].(map[string]any); ok {
			walk(path+"[]", items)
		}
	}
	walk("", schema)
	slices.Sort(open)
	if len(open) > 0 {
		t.Errorf("objects without additionalProperties in values.schema.json: %v", open)
	}
}

func isMap(v any) bool { _, ok := v.(map[string]any); return ok }

// TestValuesAreDocumented checks that values.yaml is the chart's manual:
// every leaf key, at every level, is covered by a comment at its own
// indentation, above it or above the run of sibling keys it belongs to (a
// mapping key is covered through its children); and every top-level key of
// the schema appears in values.yaml.
func TestValuesAreDocumented(t *testing.T) {
	lines := strings.Split(readFile(t, "charts/watchgate/values.yaml"), "\n")
	indent := func(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }
	isKey := func(l string) bool {
		tr := strings.TrimSpace(l)
		return tr != "" && !strings.HasPrefix(tr, "#") && !strings.HasPrefix(tr, "-") && strings.Contains(tr, ":")
	}
	for i, line := range lines {
		if !isKey(line) {
			continue
		}
		ind := indent(line)
		// A mapping key: its children carry the documentation.
		if i+1 < len(lines) && strings.TrimSpace(lines[i+1]) != "" && indent(lines[i+1]) > ind && !strings.HasPrefix(strings.TrimSpace(lines[i+1]), "-") {
			continue
		}
		documented, inList := false, false
		for j := i - 1; j >= 0; j-- {
			l := lines[j]
			tr := strings.TrimSpace(l)
			if tr == "" {
				break
			}
			if indent(l) > ind {
				continue // content of a sibling
			}
			if indent(l) < ind {
				inList = strings.HasPrefix(tr, "-")
				break
			}
			if strings.HasPrefix(tr, "#") {
				documented = true
				break
			}
			if strings.HasPrefix(tr, "-") {
				inList = true
				break
			}
		}
		if !documented && !inList {
			t.Errorf("values.yaml:%d: %s has no comment", i+1, strings.TrimSpace(line))
		}
	}
	var schema map[string]any
	if err := json.Unmarshal([]byte(readFile(t, "charts/watchgate/values.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	for key := range schema["properties"].(map[string]any) {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, key+":") }) {
			t.Errorf("values.schema.json declares %s, values.yaml does not show it", key)
		}
	}
	if _, err := os.Stat(filepath.Join(chart, "templates", "NOTES.txt")); err != nil {
		t.Error(err)
	}
}
