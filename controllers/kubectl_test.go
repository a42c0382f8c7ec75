package controllers_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
	"github.com/watchgate/watchgate/test/apiserver"
)

// `kubectl get wb` shows mode, limits, live figures and readiness at a
// glance, through the real kubectl.
func TestKubectlGetShowsTheColumns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := startReplica(t, replicaOptions{Options: controllers.Options{PodName: "kubectl"}})
	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "kubectl-shown"},
		Spec: v1alpha1.WatchBudgetSpec{
			Precedence:  77,
			Enforcement: v1alpha1.EnforcementDryRun,
			Subjects:    []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "kubectl-*"}},
			Limits:      v1alpha1.Limits{WatchOpensPerMinute: ptr.To[int32](120), WatchBurst: ptr.To[int32](2), MaxConcurrentWatches: ptr.To[int32](50)},
			Aggregate:   &v1alpha1.Aggregate{MaxConcurrentWatches: ptr.To[int32](400)},
		},
	})
	eventually(t, reloadDeadline, "the budget reaches the engine", func() error {
		_, err := policyBudget(r.engine, "kubectl-shown")
		return err
	})
	// Three watches against a burst of two: one open too many (DryRun
	// admits it, and counts it as a rejection).
	for range 3 {
		r.engine.Decide(time.Now(), &ratelimit.Request{User: "kubectl-carol", Verb: ratelimit.VerbWatch, Resource: "secrets", ResourceVersion: "9"})
	}
	eventually(t, 5*time.Second, "the sums", func() error {
		st := getBudget(t, "kubectl-shown").Status
		if st.ActiveWatches != 3 || st.RecentRejections != 1 {
			return fmt.Errorf("active %d, recent rejections %d", st.ActiveWatches, st.RecentRejections)
		}
		return nil
	})

	out, err := env.Kubectl(ctx, "get", "wb", "kubectl-shown")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get wb printed %d lines, want a header and a row:\n%s", len(lines), out)
	}
	header := strings.Join(strings.Fields(lines[0]), " ")
	if want := "NAME ENFORCEMENT REQUESTS OPENS/MIN BURST MAX WATCHES AGGREGATE ACTIVE REJECTIONS READY AGE"; header != want {
		t.Errorf("header = %q, want %q", header, want)
	}
	row := strings.Fields(lines[1])
	if want := []string{"kubectl-shown", "DryRun", "Any", "120", "2", "50", "400", "3", "1", "True"}; len(row) != len(want)+1 || strings.Join(row[:len(want)], " ") != strings.Join(want, " ") {
		t.Errorf("row = %q, want %q then the age", row, want)
	}

	wide, err := env.Kubectl(ctx, "get", "watchbudgets.watchgate.io", "kubectl-shown", "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(wide, "PRECEDENCE") || !strings.Contains(wide, "77") {
		t.Errorf("-o wide does not show the precedence:\n%s", wide)
	}

	// An Exempt budget ignores its limits and aggregate: "-", not the
	// defaults nor the spec's numbers.
	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "kubectl-exempt"},
		Spec: v1alpha1.WatchBudgetSpec{
			Precedence:  78,
			Enforcement: v1alpha1.EnforcementExempt,
			Subjects:    []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "kubectl-exempt"}},
			Aggregate:   &v1alpha1.Aggregate{MaxConcurrentWatches: ptr.To[int32](400)},
		},
	})
	eventually(t, reloadDeadline, "the Exempt budget's row", func() error {
		out, err := env.Kubectl(ctx, "get", "wb", "kubectl-exempt", "--no-headers")
		if err != nil {
			return err
		}
		row := strings.Fields(out)
		if want := []string{"kubectl-exempt", "Exempt", "Any", "-", "-", "-", "-"}; len(row) < len(want) || strings.Join(row[:len(want)], " ") != strings.Join(want, " ") {
			return fmt.Errorf("row = %q, want it to start with %q", row, want)
		}
		return nil
	})
}

// `kubectl explain` is a manual: every field documented, with units,
// defaults and bounds.
func TestKubectlExplainDocumentsTheFields(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out string
	// The API server publishes the CRD's OpenAPI a moment after it is
	// established.
	eventually(t, 30*time.Second, "kubectl explain knows watchbudget.spec", func() error {
		var err error
		out, err = env.Kubectl(ctx, "explain", "watchbudget.spec", "--recursive")
		return err
	})
	for _, field := range []string{"precedence", "subjects", "kind", "namespace", "resources", "apiGroups", "namespaces",
		"enforcement", "limits", "watchOpensPerMinute", "watchBurst", "maxConcurrentWatches", "initialStateCost",
		"listsPerMinute", "listBurst", "backoff", "initialDelaySeconds", "maxDelaySeconds", "shortWatchSeconds",
		"resetAfterSeconds", "staleVersions", "action", "memorySeconds", "aggregate", "suggestion", "share", "headroomPercent"} {
		if !strings.Contains(out, field) {
			t.Errorf("explain --recursive lacks %s:\n%s", field, out)
		}
	}
	for path, want := range map[string]string{
		"watchbudget.spec.backoff.maxDelaySeconds":     "Must be at least\n    initialDelaySeconds. Between 0 and 3600; default 60.",
		"watchbudget.spec.limits.watchOpensPerMinute":  "0 means opens are not limited",
		"watchbudget.spec.enforcement":                 "Exempt admits everything without tracking it",
		"watchbudget.status.replicas.recentRejections": "in the last 5 minutes",
		"watchbudget.spec.aggregate":                   "made-up impersonated names, each a fresh identity, cannot multiply what one caller may open",
		"watchbudget.spec.suggestion.share":            "Between 1 and 100; default 95.",
		"watchbudget.spec.suggestion.headroomPercent":  "Between 100 and 1000; default 150.",
		"watchbudget.status.suggested.wouldRefuse":     "It is the most that any one of these refuses: a lower bound.",
		"watchbudget.status.replicas.observed":         "never who they are",
	} {
		out, err := env.Kubectl(ctx, "explain", path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(collapse(out), collapse(want)) {
			t.Errorf("explain %s lacks %q:\n%s", path, want, out)
		}
	}
}

// collapse folds runs of white space, so that text compares whatever the
// wrapping.
func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }

// The samples in config/samples are accepted by the API server as they are.
func TestSamplesAreValid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := env.Kubectl(ctx, "apply", "--dry-run=server", "-k", filepath.Join(apiserver.RepoRoot(), "config", "samples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dashboard-users", "catch-all", "exempt-system-masters"} {
		if !strings.Contains(out, "watchbudget.watchgate.io/"+name+" created (server dry run)") {
			t.Errorf("sample %s not created:\n%s", name, out)
		}
	}
}
