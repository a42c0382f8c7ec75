package packaging

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// dashboardFile is the Grafana dashboard the chart ships.
const dashboardFile = "charts/watchgate/dashboards/watchgate.json"

// targetLabels are the labels Prometheus adds to every series it scrapes
// from the metrics Service (the ServiceMonitor's and the usual Kubernetes
// service discovery's), which a query may select or group by.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "container", "endpoint"}

// dashboardViews are the views the dashboard is for, each with the
// metrics its panels must read.
var dashboardViews = map[string][]string{
	"the storm stopped: watches upstream against answered locally": {
		"watchgate_proxy_upstream_watch_opens_total", "watchgate_proxy_requests_total", "watchgate_proxy_guard_rejections_total"},
	"rejections by reason and budget":              {"watchgate_proxy_requests_total"},
	"open watches per replica against the cap":     {"watchgate_proxy_active_watches", "watchgate_proxy_max_watches"},
	"review pressure":                              {"watchgate_proxy_reviews_sent_total", "watchgate_proxy_reviews_throttled_total", "watchgate_proxy_reviews_failed_total"},
	"memory-guard pressure":                        {"watchgate_proxy_memory_in_use_bytes", "watchgate_proxy_memory_limit_bytes"},
	"connections from clients and to the upstream": {"watchgate_proxy_connections", "watchgate_proxy_connections_refused_total", "watchgate_proxy_upstream_connections"},
}

// Every query of the dashboard (panels and template variables) is
// well-formed as far as a tokenizer can tell, names only series that
// watchgate's /metrics exposes (the metrics the code defines, the metric
// table's source of truth, with a histogram's _bucket, _sum and _count) or
// Prometheus' own up, and selects only labels those series carry; and
// the dashboard reads what each of its views needs.
func TestDashboardQueriesNameExposedMetrics(t *testing.T) {
	exposed := exposedSeries(definedMetrics(t))
	var dash struct {
		Title      string                            `json:"title"`
		UID        string                            `json:"uid"`
		Panels     []dashboardPanel                  `json:"panels"`
		Templating struct{ List []templateVariable } `json:"templating"`
	}
	if err := json.Unmarshal([]byte(readFile(t, dashboardFile)), &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Errorf("%s: title %q, uid %q; want both set", dashboardFile, dash.Title, dash.UID)
	}
	read := map[string]bool{}
	check := func(where, query string, extraLabels ...string) {
		t.Helper()
		for _, m := range checkQuery(t, exposed, where, query, extraLabels...) {
			read[m] = true
		}
	}
	ids := map[int]bool{}
	queries := 0
	var walk func([]dashboardPanel)
	walk = func(panels []dashboardPanel) {
		for _, p := range panels {
			where := fmt.Sprintf("panel %q", p.Title)
			if ids[p.ID] {
				t.Errorf("%s: id %d is used twice", where, p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Title == "" || p.Description == "" {
				t.Errorf("panel %d: title %q, description %q; want both, the description saying what it shows", p.ID, p.Title, p.Description)
			}
			if p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: data source %q, want the dashboard's variable ${datasource}", where, p.Datasource.UID)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s has no query", where)
			}
			for _, q := range p.Targets {
				queries++
				check(where, q.Expr)
			}
		}
	}
	walk(dash.Panels)
	if queries < 10 {
		t.Errorf("%d queries in the dashboard's panels, want every panel's", queries)
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var o struct{ Query string }
			if err := json.Unmarshal(v.Query, &o); err != nil {
				t.Errorf("variable %s: query %s is neither a string nor {query: …}", v.Name, v.Query)
				continue
			}
			q = o.Query
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(<query>, <label>), the one form this test reads", v.Name, q)
			continue
		}
		check("variable "+v.Name, m[1], m[2])
	}
	for view, metrics := range dashboardViews {
		for _, m := range metrics {
			if !read[m] {
				t.Errorf("the dashboard shows %s without reading %s", view, m)
			}
		}
	}
}

// Every alert of the chart's PrometheusRule names only series and labels
// watchgate's /metrics serves, as the dashboard's queries do.
func TestAlertQueriesNameExposedMetrics(t *testing.T) {
	exposed := exposedSeries(definedMetrics(t))
	rule := find(t, decode(t, render(t, "watchgate", "monitoring", "--set", "metrics.prometheusRule.enabled=true")), "PrometheusRule", "")
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	alerts := 0
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			r := r.(map[string]any)
			expr, _ := r["expr"].(string)
			checkQuery(t, exposed, fmt.Sprintf("alert %v", r["alert"]), expr)
			alerts++
		}
	}
	if alerts < 5 {
		t.Errorf("%d alerts in the PrometheusRule, want all of them", alerts)
	}
}

// checkQuery fails t unless query is well-formed as far as promQLSelectors
// can tell, names at least one series, and only series exposed serves,
// selecting only their labels (and extraLabels, which a caller knows the
// query reads). It returns the series named.
func checkQuery(t *testing.T, exposed map[string][]string, where, query string, extraLabels ...string) []string {
	t.Helper()
	sels, err := promQLSelectors(query)
	if err != nil {
		t.Errorf("%s: %q: %v", where, query, err)
		return nil
	}
	if len(sels) == 0 {
		t.Errorf("%s: %q names no metric", where, query)
	}
	var named []string
	for _, s := range sels {
		labels, ok := exposed[s.metric]
		if !ok {
			t.Errorf("%s: %q names %s, which watchgate's /metrics does not expose", where, query, s.metric)
			continue
		}
		named = append(named, s.metric)
		for _, l := range append(s.labels, extraLabels...) {
			if !slices.Contains(labels, l) && !slices.Contains(targetLabels, l) {
				t.Errorf("%s: %q selects label %s of %s, which has only %v (and the target's %v)", where, query, l, s.metric, labels, targetLabels)
			}
		}
	}
	return named
}

type dashboardPanel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Datasource  struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

type templateVariable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// labelValues is Grafana's label_values(<query>, <label>).
var labelValues = regexp.MustCompile(`^\s*label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// exposedSeries are the series names /metrics serves for the metrics code
// defines, each with its labels, and Prometheus' own up.
func exposedSeries(code map[string]definedMetric) map[string][]string {
	series := map[string][]string{"up": nil}
	for name, m := range code {
		if !m.histogram {
			series[name] = m.labels
			continue
		}
		series[name+"_bucket"] = append(slices.Clone(m.labels), "le")
		series[name+"_sum"] = m.labels
		series[name+"_count"] = m.labels
	}
	return series
}

// vectorSelector is one metric a PromQL query reads, with the names of
// the labels its matchers test.
type vectorSelector struct {
	metric string
	labels []string
}

// labelListKeywords are followed by a parenthesised list of label names.
var labelListKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promQLWords are PromQL's words that name neither a metric nor, followed
// by "(", a function.
var promQLWords = map[string]bool{"bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true, "inf": true, "nan": true}

// promQLSelectors returns the vector selectors of query, in order. It is a
// tokenizer, not a parser (Prometheus' parser is not in the module graph):
// it skips strings, numbers and durations, range and subquery brackets,
// Grafana variables ($name, ${name}), label lists after by, without, on,
// ignoring, group_left and group_right, and function and aggregation names
// (a word followed by "(", or by "by (" or "without ("); every other word is a metric name, and the braces
// after it its matchers. It fails on unbalanced brackets, unterminated
// strings, and a selector without a metric name ({__name__=…}), which it
// could not check.
func promQLSelectors(query string) ([]vectorSelector, error) {
	var sels []vectorSelector
	var open []byte
	q := query
	for i := 0; i < len(q); {
		c := q[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(q, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '(':
			open = append(open, ')')
			i++
		case c == ')':
			if len(open) == 0 || open[len(open)-1] != ')' {
				return nil, fmt.Errorf("unbalanced ) at %d", i)
			}
			open = open[:len(open)-1]
			i++
		case c == '[':
			end := strings.IndexByte(q[i:], ']')
			if end < 0 {
				return nil, fmt.Errorf("unterminated [ at %d", i)
			}
			i += end + 1
		case c == ']' || c == '}':
			return nil, fmt.Errorf("unbalanced %c at %d", c, i)
		case c == '{':
			return nil, fmt.Errorf("a selector without a metric name at %d", i)
		case c == '$':
			i++
			if i < len(q) && q[i] == '{' {
				end := strings.IndexByte(q[i:], '}')
				if end < 0 {
					return nil, fmt.Errorf("unterminated ${ at %d", i)
				}
				i += end + 1
				continue
			}
			for i < len(q) && isWordByte(q[i]) {
				i++
			}
		case isDigit(c) || (c == '.' && i+1 < len(q) && isDigit(q[i+1])):
			// A number (1e-9, 0x1f, .5) or a duration (5m30s).
			for i < len(q) && (isWordByte(q[i]) || q[i] == '.' ||
				((q[i] == '+' || q[i] == '-') && (q[i-1] == 'e' || q[i-1] == 'E'))) {
				i++
			}
		case isWordStart(c):
			start := i
			for i < len(q) && isWordByte(q[i]) {
				i++
			}
			word := q[start:i]
			next := i
			for next < len(q) && (q[next] == ' ' || q[next] == '\t' || q[next] == '\n') {
				next++
			}
			followedBy := byte(0)
			if next < len(q) {
				followedBy = q[next]
			}
			switch {
			case labelListKeywords[word]:
				if followedBy == '(' {
					end := strings.IndexByte(q[next:], ')')
					if end < 0 {
						return nil, fmt.Errorf("unterminated label list after %s", word)
					}
					i = next + end + 1
				}
			case promQLWords[strings.ToLower(word)], followedBy == '(', aggregationClause(q[next:]):
			default:
				s := vectorSelector{metric: word}
				if followedBy == '{' {
					labels, end, err := matcherLabels(q, next)
					if err != nil {
						return nil, err
					}
					s.labels, i = labels, end
				}
				sels = append(sels, s)
			}
		default:
			i++ // an operator or a comma
		}
	}
	if len(open) > 0 {
		return nil, fmt.Errorf("%d unclosed (", len(open))
	}
	return sels, nil
}

// aggregationClause reports whether rest starts with "by" or "without"
// and a label list: after an aggregation operator (sum by (pod) (…)).
func aggregationClause(rest string) bool {
	for _, kw := range []string{"by", "without"} {
		if after, ok := strings.CutPrefix(rest, kw); ok && strings.HasPrefix(strings.TrimLeft(after, " \t\n"), "(") {
			return true
		}
	}
	return false
}

// matcherLabels reads the matchers in the braces that open at q[start]
// and returns the label names they test and the index after the "}".
func matcherLabels(q string, start int) ([]string, int, error) {
	var labels []string
	expectName := true
	for i := start + 1; i < len(q); {
		c := q[i]
		switch {
		case c == '}':
			return labels, i + 1, nil
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(q, i)
			if err != nil {
				return nil, 0, err
			}
			i = end
		case c == ',':
			expectName = true
			i++
		case isWordStart(c) && expectName:
			begin := i
			for i < len(q) && isWordByte(q[i]) {
				i++
			}
			labels = append(labels, q[begin:i])
			expectName = false
		default:
			i++
		}
	}
	return nil, 0, fmt.Errorf("unterminated { at %d", start)
}

// skipString returns the index after the string literal that opens at
// q[start]; backquoted strings have no escapes.
func skipString(q string, start int) (int, error) {
	quote := q[start]
	for i := start + 1; i < len(q); i++ {
		switch q[i] {
		case '\\':
			if quote != '`' {
				i++
			}
		case quote:
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at %d", start)
}

func isDigit(c byte) bool     { return c >= '0' && c <= '9' }
func isWordStart(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isWordByte(c byte) bool  { return isWordStart(c) || isDigit(c) }

func TestPromQLSelectors(t *testing.T) {
	for query, want := range map[string][]vectorSelector{
		`sum by (budget, reason) (rate(watchgate_proxy_requests_total{job=~"$job", decision="reject"}[5m])) > 5`: {
			{"watchgate_proxy_requests_total", []string{"job", "decision"}}},
		`histogram_quantile(0.99, sum by (le, verb) (rate(x_bucket{verb!="other"}[$__rate_interval])))`: {
			{"x_bucket", []string{"verb"}}},
		`a / on(pod) group_left(node) b offset 5m`:                      {{"a", nil}, {"b", nil}},
		`absent(up{job="x"} == 1)`:                                      {{"up", []string{"job"}}},
		`sum(rate(a[1h:5m])) without (instance) > bool 1e-9`:            {{"a", nil}},
		`clamp_min(x{reason="a}b,c=\"d\""}, 1e-9) and ignoring (pod) y`: {{"x", []string{"reason"}}, {"y", nil}},
		"max by (pod) (m{job=~`a|b`} > 0) * ${factor} + $other":         {{"m", []string{"job"}}},
		`rate(a[5m] @ start())`:                                         {{"a", nil}},
		`sum without(le) (a) unless b`:                                  {{"a", nil}, {"b", nil}},
	} {
		got, err := promQLSelectors(query)
		if err != nil {
			t.Errorf("%s: %v", query, err)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s:\n got %v\nwant %v", query, got, want)
		}
	}
	for _, bad := range []string{`sum(rate(a[5m])`, `a{job="x"`, `a{job="x}`, `{__name__="a"}`, `rate(a[5m)`, `a)`} {
		if got, err := promQLSelectors(bad); err == nil {
			t.Errorf("%s: %v, want an error", bad, got)
		}
	}
}

// `helm template --set dashboard.enabled=true` renders the dashboard as one
// ConfigMap labelled for the Grafana sidecar, holding the dashboard file as
// valid JSON; off by default; the label and namespace are values.
func TestDashboardConfigMapRenders(t *testing.T) {
	for _, o := range decode(t, render(t, "watchgate", "monitoring")) {
		if o.GetKind() == "ConfigMap" {
			t.Errorf("default values render ConfigMap %s; the dashboard is off by default", o.GetName())
		}
	}
	var want any
	if err := json.Unmarshal([]byte(readFile(t, dashboardFile)), &want); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		set                     []string
		namespace, label, value string
	}{
		"the default label":                     {[]string{"dashboard.enabled=true"}, "monitoring", "grafana_dashboard", "1"},
		"another label, in Grafana's namespace": {[]string{"dashboard.enabled=true", "dashboard.labelName=dashboards", "dashboard.labelValue=watchgate", "dashboard.namespace=grafana"}, "grafana", "dashboards", "watchgate"},
	} {
		t.Run(name, func(t *testing.T) {
			var args []string
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			cm := find(t, decode(t, render(t, "watchgate", "monitoring", args...)), "ConfigMap", "watchgate-dashboard")
			if cm.GetNamespace() != c.namespace {
				t.Errorf("namespace %q, want %q", cm.GetNamespace(), c.namespace)
			}
			if got := cm.GetLabels()[c.label]; got != c.value {
				t.Errorf("label %s=%q, want %q (labels %v)", c.label, got, c.value, cm.GetLabels())
			}
			if cm.GetLabels()["app.kubernetes.io/name"] != "watchgate" {
				t.Errorf("labels %v: not the chart's", cm.GetLabels())
			}
			data, _ := cm.Object["data"].(map[string]any)
			text, _ := data["watchgate.json"].(string)
			var got any
			if err := json.Unmarshal([]byte(text), &got); err != nil {
				t.Fatalf("data[watchgate.json] is not JSON: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("data[watchgate.json] is not %s", dashboardFile)
			}
		})
	}
}
