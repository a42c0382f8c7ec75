package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/test/apiserver"
)

// TestGoCheckAgreesWithTheCRD walks the generated CRD's schema of spec and,
// for every bound it states — minimum, maximum, minLength, maxLength,
// maxItems, enum, pattern, and the CEL rules — builds specs at the bound and
// past it, asks the real API server (a dry-run create) and the Go check
// (controllers.ToBudget: the defaults, then ratelimit.Budget.Validate)
// about each, and fails where they disagree. A spec past a bound must be
// refused by the API server (the probe is meaningful) and the Go check's
// error must name the field. So the markers and the Go check cannot drift:
// a bound changed on one side only fails here.
//
// Each spec goes through the Go types before it is sent, so both judge the
// same object (an int32 0 without a pointer is "unset" to both).
func TestGoCheckAgreesWithTheCRD(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(apiserver.RepoRoot(), "config", "crd", "bases", "watchgate.io_watchbudgets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]

	var probes []probe
	walkSchema(spec, nil, &probes)
	kinds := map[string]int{}
	for _, p := range probes {
		kinds[p.bound]++
	}
	for _, k := range []string{"minimum", "maximum", "minLength", "maxLength", "maxItems", "enum", "pattern", "CEL"} {
		if kinds[k] == 0 {
			t.Errorf("no %s bound found in the CRD: the walk is broken", k)
		}
	}

	for _, p := range probes {
		name := fmt.Sprintf("%s %s=%.40s", p.bound, p.path, fmt.Sprint(p.value))
		serverErr, goErr := judge(t, p.spec)
		switch {
		case (serverErr == nil) != (goErr == nil):
			t.Errorf("%s: API server says %v; Go check says %v", name, errOrOK(serverErr), errOrOK(goErr))
		case p.past && serverErr == nil:
			t.Errorf("%s: past the bound, yet the API server accepted it: the probe is wrong", name)
		case p.past && !strings.Contains(goErr.Error(), p.path):
			t.Errorf("%s: the Go check's error does not name %s: %v", name, p.path, goErr)
		}
	}
	t.Logf("%d probes: %v", len(probes), kinds)
}

// probe is one spec built to test one bound.
type probe struct {
	bound string // minimum, maximum, ..., CEL
	path  string // the field, as the Go check names it: limits.watchBurst, subjects[0].name
	value any
	past  bool // past the bound: the API server must refuse it
	spec  map[string]any
}

// Arrays of objects get one valid item to probe into; so that the CEL rule
// on subjects is met, it is a service account with its namespace.
var baseItems = map[string]map[string]any{
	"subjects":  {"kind": "ServiceAccount", "name": "agent", "namespace": "ns"},
	"resources": {},
}

// walkSchema appends the probes of s, at steps (property names, and "[0]"
// for the first item of an array) below spec.
func walkSchema(s apiextensionsv1.JSONSchemaProps, steps []string, probes *[]probe) {
	path := pathOf(steps)
	add := func(bound string, value any, past bool) {
		*probes = append(*probes, probe{bound: bound, path: path, value: value, past: past, spec: specWith(steps, value)})
	}
	switch s.Type {
	case "integer":
		if s.Minimum != nil {
			lo := int64(*s.Minimum)
			add("minimum", lo, false)
			// A 0 in a field without a pointer is "unset" (defaulted), not
			// past the bound; -1 is.
			add("minimum", lo-1, lo-1 != 0)
			if lo-1 == 0 {
				add("minimum", int64(-1), true)
			}
		}
		if s.Maximum != nil {
			add("maximum", int64(*s.Maximum), false)
			add("maximum", int64(*s.Maximum)+1, true)
		}
	case "string":
		if s.MinLength != nil && *s.MinLength > 0 {
			add("minLength", strings.Repeat("a", int(*s.MinLength)), false)
			add("minLength", strings.Repeat("a", int(*s.MinLength)-1), true)
		}
		if s.MaxLength != nil {
			add("maxLength", strings.Repeat("a", int(*s.MaxLength)), false)
			add("maxLength", strings.Repeat("a", int(*s.MaxLength)+1), true)
		}
		for _, e := range s.Enum {
			var v string
			if err := json.Unmarshal(e.Raw, &v); err != nil {
				panic(err)
			}
			add("enum", v, false)
		}
		if len(s.Enum) > 0 {
			add("enum", "Bogus", true)
		}
		if s.Pattern != "" {
			re := regexp.MustCompile(s.Pattern)
			for _, v := range []string{"a", "a*", "*", "a*b", "**", "*a", "Team-A", "team-a", "a.b", "a:b", "-"} {
				if s.MaxLength != nil && int64(len(v)) > *s.MaxLength {
					continue
				}
				add("pattern", v, !re.MatchString(v))
			}
		}
	case "array":
		item := any("a")
		if s.Items.Schema.Type == "object" {
			item = baseItems[path]
		}
		if s.MaxItems != nil {
			add("maxItems", repeat(item, int(*s.MaxItems)), false)
			add("maxItems", repeat(item, int(*s.MaxItems)+1), true)
		}
		walkSchema(*s.Items.Schema, append(slices.Clone(steps), "[0]"), probes)
	case "object":
		for _, name := range sortedKeys(s.Properties) {
			walkSchema(s.Properties[name], append(slices.Clone(steps), name), probes)
		}
		for _, rule := range s.XValidations {
			celProbes(s, steps, rule.Rule, probes)
		}
	}
}

var selfField = regexp.MustCompile(`self\.([a-zA-Z]+)`)

// celProbes appends, for one CEL rule of the object at steps, every
// combination of values of the fields it reads: integers absent, 0, 1, 2
// or 3; enums each value; other strings absent or "ns".
func celProbes(s apiextensionsv1.JSONSchemaProps, steps []string, rule string, probes *[]probe) {
	var fields []string
	for _, m := range selfField.FindAllStringSubmatch(rule, -1) {
		if !slices.Contains(fields, m[1]) {
			fields = append(fields, m[1])
		}
	}
	choices := make([][]any, len(fields))
	for i, f := range fields {
		fs := s.Properties[f]
		switch {
		case fs.Type == "integer":
			choices[i] = []any{nil, 0, 1, 2, 3}
		case len(fs.Enum) > 0:
			for _, e := range fs.Enum {
				var v string
				_ = json.Unmarshal(e.Raw, &v)
				choices[i] = append(choices[i], v)
			}
		default:
			choices[i] = []any{nil, "ns"}
		}
	}
	base := map[string]any{}
	if len(steps) > 0 && steps[len(steps)-1] == "[0]" {
		base = baseItems[pathOf(steps[:len(steps)-1])]
	}
	var rec func(i int, obj map[string]any)
	rec = func(i int, obj map[string]any) {
		if i == len(fields) {
			*probes = append(*probes, probe{bound: "CEL", path: pathOf(steps), value: obj, spec: specWith(steps, obj)})
			return
		}
		for _, c := range choices[i] {
			next := clone(obj)
			if c == nil {
				delete(next, fields[i])
			} else {
				next[fields[i]] = c
			}
			rec(i+1, next)
		}
	}
	rec(0, clone(base))
}

// specWith is a spec with value at steps, inside one base item for each
// array on the way.
func specWith(steps []string, value any) map[string]any {
	spec := map[string]any{}
	cur := spec
	for i, step := range steps {
		last := i == len(steps)-1
		if i+1 < len(steps) && steps[i+1] == "[0]" {
			// An array: its one item is the value, or a base item to go
			// into.
			if i+2 == len(steps) {
				cur[step] = []any{value}
				return spec
			}
			item := clone(baseItems[pathOf(steps[:i+1])])
			cur[step] = []any{item}
			cur = item
			continue
		}
		if step == "[0]" {
			continue
		}
		if last {
			cur[step] = value
			return spec
		}
		next, _ := cur[step].(map[string]any)
		if next == nil {
			next = map[string]any{}
			cur[step] = next
		}
		cur = next
	}
	return spec
}

// judge asks the API server (dry run) and the Go check about one spec.
func judge(t *testing.T, spec map[string]any) (serverErr, goErr error) {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	wb := &v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: "crd-agreement"}}
	if err := json.Unmarshal(raw, &wb.Spec); err != nil {
		t.Fatalf("spec %s: %v", raw, err)
	}
	_, goErr = controllers.ToBudget(wb.DeepCopy())
	serverErr = admin.Create(context.Background(), wb, client.DryRunAll)
	if serverErr != nil && !apierrors.IsInvalid(serverErr) {
		t.Fatalf("dry-run create of %s: %v", raw, serverErr)
	}
	return serverErr, goErr
}

func pathOf(steps []string) string {
	var b strings.Builder
	for _, s := range steps {
		if s != "[0]" && b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s)
	}
	return b.String()
}

func repeat(item any, n int) []any {
	out := make([]any, n)
	for i := range out {
		if m, ok := item.(map[string]any); ok {
			out[i] = clone(m)
		} else {
			out[i] = item
		}
	}
	return out
}

func clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func sortedKeys(m map[string]apiextensionsv1.JSONSchemaProps) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func errOrOK(err error) string {
	if err == nil {
		return "valid"
	}
	return err.Error()
}
