package controllers_test

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/watchgate/watchgate/api/v1alpha1"
)

// The API server itself rejects nonsense, with the message the CRD's
// OpenAPI schema or CEL rule states.
func TestAPIServerRejectsInvalidSpecs(t *testing.T) {
	subjects := make([]v1alpha1.Subject, 65)
	for i := range subjects {
		subjects[i] = v1alpha1.Subject{Kind: v1alpha1.SubjectKindUser, Name: "u"}
	}
	for name, tc := range map[string]struct {
		spec v1alpha1.WatchBudgetSpec
		want string
	}{
		"rejects a max delay below the initial delay": {
			spec: v1alpha1.WatchBudgetSpec{Backoff: v1alpha1.Backoff{InitialDelaySeconds: ptr.To[int32](10), MaxDelaySeconds: ptr.To[int32](5)}},
			want: "spec.backoff.maxDelaySeconds: Invalid value: maxDelaySeconds must be at least initialDelaySeconds",
		},
		"rejects a zero burst with a rate": {
			spec: v1alpha1.WatchBudgetSpec{Limits: v1alpha1.Limits{WatchOpensPerMinute: ptr.To[int32](10), WatchBurst: ptr.To[int32](0)}},
			want: "spec.limits.watchBurst: Invalid value: watchBurst must be at least 1 when watchOpensPerMinute is set",
		},
		"rejects an initial-state cost above the burst": {
			spec: v1alpha1.WatchBudgetSpec{Limits: v1alpha1.Limits{WatchBurst: ptr.To[int32](2), InitialStateCost: ptr.To[int32](3)}},
			want: "spec.limits.initialStateCost: Invalid value: initialStateCost must not exceed watchBurst",
		},
		"rejects a zero list burst with a list rate": {
			spec: v1alpha1.WatchBudgetSpec{Limits: v1alpha1.Limits{ListsPerMinute: ptr.To[int32](10), ListBurst: ptr.To[int32](0)}},
			want: "spec.limits.listBurst: Invalid value: listBurst must be at least 1 when listsPerMinute is set",
		},
		"rejects a zero per-resource list burst with a per-resource list rate": {
			spec: v1alpha1.WatchBudgetSpec{Limits: v1alpha1.Limits{ListsPerMinutePerResource: ptr.To[int32](10), ListBurstPerResource: ptr.To[int32](0)}},
			want: "spec.limits.listBurstPerResource: Invalid value: listBurstPerResource must be at least 1 when listsPerMinutePerResource is set",
		},
		"rejects a reset shorter than a short watch": {
			spec: v1alpha1.WatchBudgetSpec{Backoff: v1alpha1.Backoff{ShortWatchSeconds: ptr.To[int32](60), ResetAfterSeconds: ptr.To[int32](30)}},
			want: "spec.backoff.resetAfterSeconds: Invalid value: resetAfterSeconds must be at least shortWatchSeconds",
		},
		"rejects a precedence above 10000": {
			spec: v1alpha1.WatchBudgetSpec{Precedence: 10001},
			want: "spec.precedence: Invalid value: 10001: spec.precedence in body should be less than or equal to 10000",
		},
		"rejects a negative rate": {
			spec: v1alpha1.WatchBudgetSpec{Limits: v1alpha1.Limits{WatchOpensPerMinute: ptr.To[int32](-1)}},
			want: "spec.limits.watchOpensPerMinute in body should be greater than or equal to 0",
		},
		"rejects an unknown enforcement": {
			spec: v1alpha1.WatchBudgetSpec{Enforcement: "Sometimes"},
			want: `spec.enforcement: Unsupported value: "Sometimes": supported values: "Enforce", "DryRun", "Exempt"`,
		},
		"rejects a star inside a name": {
			spec: v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "a*b"}}},
			want: "spec.subjects[0].name in body should match",
		},
		"rejects a service account without namespace": {
			spec: v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindServiceAccount, Name: "agent"}}},
			want: "namespace is required for kind ServiceAccount and not allowed for kinds User and Group",
		},
		"rejects a user with a namespace": {
			spec: v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "alice", Namespace: "team-a"}}},
			want: "namespace is required for kind ServiceAccount and not allowed for kinds User and Group",
		},
		"rejects an unknown subject kind": {
			spec: v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: "Robot", Name: "r2"}}},
			want: `spec.subjects[0].kind: Unsupported value: "Robot"`,
		},
		"rejects more than 64 subjects": {
			spec: v1alpha1.WatchBudgetSpec{Subjects: subjects},
			want: "spec.subjects: Too many: 65: must have at most 64 items",
		},
		"rejects a name longer than 253 characters": {
			spec: v1alpha1.WatchBudgetSpec{Subjects: []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindGroup, Name: strings.Repeat("g", 254)}}},
			want: "spec.subjects[0].name: Too long: may not be more than 253",
		},
		"rejects an unknown stale action": {
			spec: v1alpha1.WatchBudgetSpec{StaleVersions: v1alpha1.StaleVersions{Action: "Ignore"}},
			want: `spec.staleVersions.action: Unsupported value: "Ignore"`,
		},
		"rejects a zero memory": {
			spec: v1alpha1.WatchBudgetSpec{StaleVersions: v1alpha1.StaleVersions{MemorySeconds: ptr.To[int32](0)}},
			want: "spec.staleVersions.memorySeconds in body should be greater than or equal to 1",
		},
	} {
		t.Run(name, func(t *testing.T) {
			wb := &v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: "invalid"}, Spec: tc.spec}
			err := admin.Create(context.Background(), wb)
			if err == nil {
				_ = admin.Delete(context.Background(), wb)
				t.Fatal("the API server accepted it")
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v\nwant Invalid containing %q", err, tc.want)
			}
		})
	}
}

// What the API server fills in is what the documentation promises, and
// what the controllers' own defaults assume.
func TestAPIServerDefaults(t *testing.T) {
	wb := &v1alpha1.WatchBudget{ObjectMeta: metav1.ObjectMeta{Name: "defaults"}}
	createBudget(t, wb)
	s := getBudget(t, "defaults").Spec
	got := []any{s.Precedence, s.Enforcement,
		*s.Limits.WatchOpensPerMinute, *s.Limits.WatchBurst, *s.Limits.MaxConcurrentWatches, *s.Limits.InitialStateCost, *s.Limits.ListsPerMinute, *s.Limits.ListBurst,
		*s.Limits.ListsPerMinutePerResource, *s.Limits.ListBurstPerResource,
		*s.Backoff.InitialDelaySeconds, *s.Backoff.MaxDelaySeconds, *s.Backoff.ShortWatchSeconds, *s.Backoff.ResetAfterSeconds,
		s.StaleVersions.Action, *s.StaleVersions.MemorySeconds,
		*s.Suggestion.Share, *s.Suggestion.HeadroomPercent}
	want := []any{int32(1000), v1alpha1.EnforcementEnforce,
		int32(60), int32(30), int32(0), int32(1), int32(0), int32(10),
		int32(0), int32(5),
		int32(1), int32(60), int32(10), int32(120),
		v1alpha1.StaleActionReject, int32(900),
		int32(95), int32(150)}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("defaulted spec = %v\nwant %v", got, want)
			break
		}
	}
}
