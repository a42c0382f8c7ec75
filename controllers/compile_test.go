package controllers

import (
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/ratelimit"
)

func TestToBudgetConverts(t *testing.T) {
	wb := &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "dashboard"},
		Spec: v1alpha1.WatchBudgetSpec{
			Precedence:  500,
			Enforcement: v1alpha1.EnforcementDryRun,
			Subjects: []v1alpha1.Subject{
				{Kind: v1alpha1.SubjectKindGroup, Name: "dashboard-users"},
				{Kind: v1alpha1.SubjectKindServiceAccount, Name: "agent-*", Namespace: "cattle-*"},
			},
			Resources: []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Namespaces: []string{"team-a"}}},
			Limits: v1alpha1.Limits{
				WatchOpensPerMinute: ptr.To[int32](120), WatchBurst: ptr.To[int32](10), MaxConcurrentWatches: ptr.To[int32](50),
				InitialStateCost: ptr.To[int32](2), ListsPerMinute: ptr.To[int32](30), ListBurst: ptr.To[int32](5),
				ListsPerMinutePerResource: ptr.To[int32](12), ListBurstPerResource: ptr.To[int32](3),
			},
			Backoff: v1alpha1.Backoff{
				InitialDelaySeconds: ptr.To[int32](2), MaxDelaySeconds: ptr.To[int32](40),
				ShortWatchSeconds: ptr.To[int32](5), ResetAfterSeconds: ptr.To[int32](300),
			},
			StaleVersions: v1alpha1.StaleVersions{Action: v1alpha1.StaleActionPass, MemorySeconds: ptr.To[int32](60)},
			Suggestion:    v1alpha1.Suggestion{Share: ptr.To[int32](80), HeadroomPercent: ptr.To[int32](200)},
		},
	}
	got, err := ToBudget(wb)
	if err != nil {
		t.Fatal(err)
	}
	want := ratelimit.Budget{
		Name: "dashboard", Precedence: 500, Enforcement: ratelimit.DryRun,
		Subjects: []ratelimit.Subject{
			{Kind: ratelimit.Group, Name: "dashboard-users"},
			{Kind: ratelimit.ServiceAccount, Name: "agent-*", Namespace: "cattle-*"},
		},
		Resources: []ratelimit.ResourceRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Namespaces: []string{"team-a"}}},
		Limits: ratelimit.Limits{WatchOpensPerMinute: 120, WatchBurst: 10, MaxConcurrentWatches: 50, InitialStateCost: 2, ListsPerMinute: 30, ListBurst: 5,
			ListsPerMinutePerResource: 12, ListBurstPerResource: 3},
		Backoff:       ratelimit.Backoff{Initial: 2 * time.Second, Max: 40 * time.Second, ShortWatch: 5 * time.Second, ResetAfter: 300 * time.Second},
		StaleVersions: ratelimit.StaleVersions{Action: ratelimit.StalePass, Memory: time.Minute},
		Suggestion:    ratelimit.Suggestion{Share: 80, HeadroomPercent: 200},
	}
	if !equalBudgets(got, want) {
		t.Errorf("ToBudget:\n got %+v\nwant %+v", got, want)
	}
}

// An object that bypassed the API server's defaulting means what the CRD's
// defaults say.
func TestToBudgetDefaultsUnsetFields(t *testing.T) {
	got, err := ToBudget(&v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: "empty"}})
	if err != nil {
		t.Fatal(err)
	}
	// Enforcement and staleVersions.action stay empty: the engine's empty
	// means the CRD's default, and the engine applies it.
	want := ratelimit.Budget{
		Name: "empty", Precedence: 1000,
		Limits:        ratelimit.Limits{WatchOpensPerMinute: 60, WatchBurst: 30, InitialStateCost: 1, ListBurst: 10, ListBurstPerResource: 5},
		Backoff:       ratelimit.Backoff{Initial: time.Second, Max: time.Minute, ShortWatch: 10 * time.Second, ResetAfter: 2 * time.Minute},
		StaleVersions: ratelimit.StaleVersions{Memory: 15 * time.Minute},
		Suggestion:    ratelimit.Suggestion{Share: 95, HeadroomPercent: 150},
	}
	if !equalBudgets(got, want) {
		t.Errorf("ToBudget:\n got %+v\nwant %+v", got, want)
	}
	p, err := ratelimit.NewPolicy([]ratelimit.Budget{got})
	if err != nil {
		t.Fatalf("the defaults do not make a valid policy: %v", err)
	}
	if b := p.Budgets()[0]; b.Enforcement != ratelimit.Enforce || b.StaleVersions.Action != ratelimit.StaleReject {
		t.Errorf("enforced as %q, stale versions %q; want the CRD's defaults Enforce and Reject", b.Enforcement, b.StaleVersions.Action)
	}
}

func TestToBudgetRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		spec v1alpha1.WatchBudgetSpec
		want string
	}{
		"a max delay below the initial delay": {
			spec: v1alpha1.WatchBudgetSpec{Backoff: v1alpha1.Backoff{InitialDelaySeconds: ptr.To[int32](10), MaxDelaySeconds: ptr.To[int32](5)}},
			want: "backoff.maxDelaySeconds: must be >= backoff.initialDelaySeconds (10s)",
		},
		"a zero burst with a rate": {
			spec: v1alpha1.WatchBudgetSpec{Limits: v1alpha1.Limits{WatchOpensPerMinute: ptr.To[int32](10), WatchBurst: ptr.To[int32](0)}},
			want: "limits.watchBurst: must be >= 1 when watchOpensPerMinute > 0",
		},
		"an initial-state cost above the burst": {
			spec: v1alpha1.WatchBudgetSpec{Limits: v1alpha1.Limits{WatchBurst: ptr.To[int32](2), InitialStateCost: ptr.To[int32](3)}},
			want: "limits.initialStateCost: must be <= watchBurst (2)",
		},
		"a zero list burst with a list rate": {
			spec: v1alpha1.WatchBudgetSpec{Limits: v1alpha1.Limits{ListsPerMinute: ptr.To[int32](10), ListBurst: ptr.To[int32](0)}},
			want: "limits.listBurst: must be >= 1 when listsPerMinute > 0",
		},
		"a zero per-resource list burst with a per-resource list rate": {
			spec: v1alpha1.WatchBudgetSpec{Limits: v1alpha1.Limits{ListsPerMinutePerResource: ptr.To[int32](10), ListBurstPerResource: ptr.To[int32](0)}},
			want: "limits.listBurstPerResource: must be >= 1 when listsPerMinutePerResource > 0",
		},
		"a reset shorter than a short watch": {
			spec: v1alpha1.WatchBudgetSpec{Backoff: v1alpha1.Backoff{ShortWatchSeconds: ptr.To[int32](60), ResetAfterSeconds: ptr.To[int32](30)}},
			want: "backoff.resetAfterSeconds: must be >= backoff.shortWatchSeconds (60s)",
		},
		"a precedence out of range": {
			spec: v1alpha1.WatchBudgetSpec{Precedence: 20000},
			want: "precedence: must be <= 10000, not 20000",
		},
		"an unknown enforcement": {
			spec: v1alpha1.WatchBudgetSpec{Enforcement: "Sometimes"},
			want: `enforcement: must be one of Enforce, DryRun, Exempt, not "Sometimes"`,
		},
		"a star inside a name": {
			spec: v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "a*b"}}},
			want: "subjects[0].name: '*' is only allowed at the end",
		},
		"a service account without namespace": {
			spec: v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindServiceAccount, Name: "agent"}}},
			want: "subjects[0].namespace: must not be empty for kind ServiceAccount",
		},
		"a user with a namespace": {
			spec: v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "alice", Namespace: "x"}}},
			want: "subjects[0].namespace: must be empty for kind User",
		},
		"a negative memory": {
			spec: v1alpha1.WatchBudgetSpec{StaleVersions: v1alpha1.StaleVersions{MemorySeconds: ptr.To[int32](-1)}},
			want: "staleVersions.memorySeconds: must be >= 0s",
		},
		"a zero memory, which the engine would read as none": {
			spec: v1alpha1.WatchBudgetSpec{StaleVersions: v1alpha1.StaleVersions{MemorySeconds: ptr.To[int32](0)}},
			want: "staleVersions.memorySeconds: must be >= 1s",
		},
		"a zero initial-state cost, which the engine would read as 1": {
			spec: v1alpha1.WatchBudgetSpec{Limits: v1alpha1.Limits{InitialStateCost: ptr.To[int32](0)}},
			want: "limits.initialStateCost: must be >= 1",
		},
		"a zero share, which the engine would read as the default": {
			spec: v1alpha1.WatchBudgetSpec{Suggestion: v1alpha1.Suggestion{Share: ptr.To[int32](0)}},
			want: "suggestion.share: must be >= 1",
		},
		"a headroom that would suggest less than was observed": {
			spec: v1alpha1.WatchBudgetSpec{Suggestion: v1alpha1.Suggestion{HeadroomPercent: ptr.To[int32](99)}},
			want: "suggestion.headroomPercent: must be >= 100",
		},
		"a zero reset with a short watch": {
			spec: v1alpha1.WatchBudgetSpec{Backoff: v1alpha1.Backoff{ShortWatchSeconds: ptr.To[int32](5), ResetAfterSeconds: ptr.To[int32](0)}},
			want: "backoff.resetAfterSeconds: must be >= backoff.shortWatchSeconds (5s)",
		},
		"every problem at once, on one line": {
			spec: v1alpha1.WatchBudgetSpec{Precedence: -1, Enforcement: "Nope"},
			want: `precedence: must be >= 0; enforcement: must be one of Enforce, DryRun, Exempt, not "Nope"`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ToBudget(&v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: tc.spec})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ToBudget error = %v, want one containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines, a condition message wants one: %q", err)
			}
		})
	}
}

func TestCompileLeavesInvalidBudgetsOut(t *testing.T) {
	c := Compile([]v1alpha1.WatchBudget{
		{ObjectMeta: metav1.ObjectMeta{Name: "good", Generation: 3}},
		{ObjectMeta: metav1.ObjectMeta{Name: "bad", Generation: 7}, Spec: v1alpha1.WatchBudgetSpec{Enforcement: "Nope"}},
	})
	if len(c.Budgets) != 1 || c.Budgets[0].Name != "good" {
		t.Errorf("Budgets = %+v, want only good", c.Budgets)
	}
	if c.Generations["good"] != 3 || len(c.Generations) != 1 {
		t.Errorf("Generations = %v, want good: 3", c.Generations)
	}
	if c.Invalid["bad"] == nil || len(c.Invalid) != 1 {
		t.Errorf("Invalid = %v, want bad", c.Invalid)
	}
	if _, err := ratelimit.NewPolicy(c.Budgets); err != nil {
		t.Errorf("NewPolicy(valid budgets) = %v", err)
	}
	if got := c.Policy.Budgets(); len(got) != 1 || got[0].Name != "good" {
		t.Errorf("Policy holds %+v, want only good", got)
	}
	_, want := ToBudget(&v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: v1alpha1.WatchBudgetSpec{Enforcement: "Nope"}})
	if c.Invalid["bad"] == nil || want == nil || c.Invalid["bad"].Error() != want.Error() {
		t.Errorf("Invalid[bad] = %v, want ToBudget's words %v", c.Invalid["bad"], want)
	}
}

// A budget the engine would read differently (initialStateCost 0) is left
// out with every problem it has, in the words ToBudget uses.
func TestCompileReportsUnconvertibleBudgetsLikeToBudget(t *testing.T) {
	wb := v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: "zero-cost"}, Spec: v1alpha1.WatchBudgetSpec{
		Enforcement: "Nope", Limits: v1alpha1.Limits{InitialStateCost: ptr.To[int32](0)},
	}}
	c := Compile([]v1alpha1.WatchBudget{wb})
	_, want := ToBudget(&wb)
	if want == nil || !strings.Contains(want.Error(), "limits.initialStateCost") || !strings.Contains(want.Error(), "enforcement") {
		t.Fatalf("ToBudget = %v, want both problems", want)
	}
	if got := c.Invalid["zero-cost"]; got == nil || got.Error() != want.Error() {
		t.Errorf("Invalid[zero-cost] = %v, want %v", got, want)
	}
	if len(c.Budgets) != 0 || len(c.Policy.Budgets()) != 0 {
		t.Errorf("the budget is in: %+v", c.Budgets)
	}
}

func equalBudgets(a, b ratelimit.Budget) bool { return reflect.DeepEqual(a, b) }

// spec.aggregate becomes the budget's Aggregate; one that bounds nothing
// is refused (the engine's zero Aggregate would silently mean "none").
func TestToBudgetConvertsTheAggregate(t *testing.T) {
	wb := &v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: "agents"}, Spec: v1alpha1.WatchBudgetSpec{
		Aggregate: &v1alpha1.Aggregate{WatchOpensPerMinute: ptr.To[int32](600), WatchBurst: ptr.To[int32](100), MaxConcurrentWatches: ptr.To[int32](2000)},
	}}
	b, err := ToBudget(wb)
	if err != nil {
		t.Fatal(err)
	}
	if want := (ratelimit.Aggregate{WatchOpensPerMinute: 600, WatchBurst: 100, MaxConcurrentWatches: 2000}); b.Aggregate != want {
		t.Errorf("aggregate %+v, want %+v", b.Aggregate, want)
	}
	if b, err := ToBudget(&v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: "plain"}}); err != nil || b.Aggregate != (ratelimit.Aggregate{}) {
		t.Errorf("no aggregate: %+v, %v; want the zero Aggregate", b.Aggregate, err)
	}
	wb.Spec.Aggregate = &v1alpha1.Aggregate{WatchBurst: ptr.To[int32](5)}
	if _, err := ToBudget(wb); err == nil || !strings.Contains(err.Error(), "aggregate") {
		t.Errorf("an aggregate that bounds nothing: %v, want an error naming aggregate", err)
	}
}
