package ratelimit

import (
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		budget Budget
		want   []string // substrings of the error, none for valid
	}{
		"a budget with only a name is valid": {budget: Budget{Name: "b"}},
		"a full budget is valid": {budget: Budget{
			Name: "b", Enforcement: DryRun,
			Subjects:      []Subject{{Kind: User, Name: "alice"}, {Kind: Group, Name: "team-*"}, {Kind: ServiceAccount, Namespace: "*", Name: "ci"}},
			Resources:     []ResourceRule{{APIGroups: []string{"", "apps"}, Resources: []string{"pods"}, Namespaces: []string{"", "team-*"}}},
			Limits:        Limits{WatchOpensPerMinute: 10, WatchBurst: 5, MaxConcurrentWatches: 3, InitialStateCost: 5, ListsPerMinute: 6, ListBurst: 1},
			Backoff:       Backoff{Initial: time.Second, Max: time.Minute, ShortWatch: time.Second, ResetAfter: time.Minute},
			StaleVersions: StaleVersions{Action: StalePass, Memory: time.Minute},
		}},
		"every problem is reported with its field path": {
			budget: Budget{
				Enforcement: "Sometimes",
				Subjects:    []Subject{{Kind: "Robot", Name: "r"}, {Kind: ServiceAccount, Name: "ci"}, {Kind: User, Name: "a*b"}},
				Resources:   []ResourceRule{{Resources: []string{""}}},
				Limits:      Limits{WatchOpensPerMinute: 10, MaxConcurrentWatches: -1, ListsPerMinute: 1},
				Backoff:     Backoff{Initial: time.Minute, Max: time.Second},
				StaleVersions: StaleVersions{
					Action: "Drop",
				},
			},
			want: []string{
				"name: must not be empty",
				"enforcement: must be one of Enforce, DryRun, Exempt",
				"subjects[0].kind: must be one of User, Group, ServiceAccount",
				"subjects[1].namespace: must not be empty",
				"subjects[2].name: '*' is only allowed at the end",
				"resources[0].resources[0]: must not be empty",
				"limits.maxConcurrentWatches: must be >= 0",
				"limits.watchBurst: must be >= 1 when watchOpensPerMinute > 0",
				"limits.listBurst: must be >= 1 when listsPerMinute > 0",
				"backoff.max: must be >= backoff.initial",
				"staleVersions.action: must be one of Reject, Pass",
			},
		},
		"a reset shorter than a short watch is invalid": {
			budget: Budget{Name: "b", Backoff: Backoff{Initial: time.Second, Max: time.Minute, ShortWatch: 10 * time.Second, ResetAfter: 5 * time.Second}},
			want:   []string{"backoff.resetAfter: must be >= backoff.shortWatch (10s) when set"},
		},
		"a watch that could never be admitted is invalid": {
			budget: Budget{Name: "b", Limits: Limits{WatchOpensPerMinute: 10, WatchBurst: 2, InitialStateCost: 3}},
			want:   []string{"limits.initialStateCost: must be <= watchBurst (2)"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.budget.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
			if got, want := strings.Count(err.Error(), "\n")+1, len(tc.want); got != want {
				t.Errorf("%d problems reported, want %d:\n%v", got, want, err)
			}
		})
	}
}

func TestNewPolicy(t *testing.T) {
	if _, err := NewPolicy([]Budget{{Name: "a"}, {Name: "a"}}); err == nil || !strings.Contains(err.Error(), `budget "a": name: duplicate`) {
		t.Errorf("duplicate names: err = %v", err)
	}
	if _, err := NewPolicy([]Budget{{Name: "a"}, {Name: "b", Limits: Limits{WatchOpensPerMinute: 1}}}); err == nil || !strings.Contains(err.Error(), `budget "b": limits.watchBurst`) {
		t.Errorf("invalid budget: err = %v", err)
	}

	in := []Budget{
		{Name: "z", Precedence: 1},
		{Name: "b", Precedence: 2, Subjects: []Subject{{Kind: User, Name: "x"}}},
		{Name: "a", Precedence: 2},
	}
	p, err := NewPolicy(in)
	if err != nil {
		t.Fatal(err)
	}
	in[1].Subjects[0].Name = "changed"
	got := p.Budgets()
	var names []string
	for _, b := range got {
		names = append(names, b.Name)
	}
	if strings.Join(names, ",") != "z,a,b" {
		t.Errorf("match order %v, want z,a,b", names)
	}
	if got[2].Subjects[0].Name != "x" {
		t.Error("NewPolicy kept a reference to its input")
	}
	got[2].Subjects[0].Name = "changed"
	if p.Budgets()[2].Subjects[0].Name != "x" {
		t.Error("Budgets returned a reference to the policy")
	}
	if got[0].Enforcement != Enforce || got[0].StaleVersions.Action != StaleReject || got[0].Limits.InitialStateCost != 1 {
		t.Errorf("defaults not filled in: %+v", got[0])
	}
}

// CompileValid keeps the valid budgets and says why each other one is out;
// NewPolicy refuses the same input as a whole.
func TestCompileValidLeavesBadBudgetsOut(t *testing.T) {
	in := []Budget{
		{Name: "a"},
		{Name: "b", Limits: Limits{WatchOpensPerMinute: 1}}, // no burst
		{Name: "a", Precedence: 5},                          // a's name is taken
		{Name: "c", Enforcement: DryRun},
	}
	p, invalid := CompileValid(in)
	var names []string
	for _, b := range p.Budgets() {
		names = append(names, b.Name)
	}
	if strings.Join(names, ",") != "a,c" {
		t.Errorf("policy holds %v, want a,c", names)
	}
	if len(invalid) != len(in) || invalid[0] != nil || invalid[3] != nil {
		t.Fatalf("invalid = %v, want errors for budgets 1 and 2 only", invalid)
	}
	if invalid[1] == nil || !strings.HasPrefix(invalid[1].Error(), "limits.watchBurst: ") {
		t.Errorf("invalid[1] = %v, want Validate's limits.watchBurst", invalid[1])
	}
	if invalid[2] == nil || invalid[2].Error() != "name: duplicate" {
		t.Errorf("invalid[2] = %v, want name: duplicate", invalid[2])
	}
	if _, err := NewPolicy(in); err == nil || err.Error() != `budget "b": `+invalid[1].Error()+"\n"+`budget "a": name: duplicate` {
		t.Errorf("NewPolicy: err = %v, want both budgets named", err)
	}
	if _, invalid := CompileValid(in[:1]); invalid != nil {
		t.Errorf("every budget valid: invalid = %v, want nil", invalid)
	}
}

func TestMatch(t *testing.T) {
	p, err := NewPolicy([]Budget{
		{Name: "masters", Precedence: 1, Enforcement: Exempt, Subjects: []Subject{{Kind: Group, Name: "system:masters"}}},
		{Name: "ci", Precedence: 10, Subjects: []Subject{{Kind: ServiceAccount, Namespace: "ci-*", Name: "*"}}},
		{Name: "kube-system", Precedence: 10, Subjects: []Subject{{Kind: ServiceAccount, Namespace: "kube-system", Name: "*"}}},
		{Name: "ops-runner", Precedence: 10, Subjects: []Subject{{Kind: ServiceAccount, Namespace: "ops", Name: "runner"}}},
		{Name: "alice-apps", Precedence: 10, Subjects: []Subject{{Kind: User, Name: "alice"}},
			Resources: []ResourceRule{{APIGroups: []string{"apps"}, Resources: []string{"deployments", "replica*"}}}},
		{Name: "aardvark", Precedence: 10, Subjects: []Subject{{Kind: User, Name: "alice"}},
			Resources: []ResourceRule{{APIGroups: []string{"apps"}, Resources: []string{"deployments"}}}},
		{Name: "team-namespaces", Precedence: 20,
			Resources: []ResourceRule{{Namespaces: []string{"team-*"}}}},
		{Name: "cluster-wide-pods", Precedence: 30,
			Resources: []ResourceRule{{Resources: []string{"pods"}, Namespaces: []string{""}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		user                       string
		groups                     []string
		group, resource, namespace string
		want                       string
	}{
		"a group member matches the lowest precedence":          {"bob", []string{"x", "system:masters"}, "", "pods", "", "masters"},
		"a service account in a matching namespace":             {"system:serviceaccount:ci-7:runner", nil, "", "pods", "default", "ci"},
		"a service account in another namespace does not":       {"system:serviceaccount:prod:runner", nil, "", "secrets", "default", ""},
		"a user that looks like a service account prefix":       {"system:serviceaccount:ci-7", nil, "", "secrets", "default", ""},
		"a service account of an exact namespace":               {"system:serviceaccount:kube-system:x", nil, "", "secrets", "default", "kube-system"},
		"a namespace that only starts like the exact one":       {"system:serviceaccount:kube-systemx:x", nil, "", "secrets", "default", ""},
		"a namespace that differs after its first byte":         {"system:serviceaccount:kube-systen:x", nil, "", "secrets", "default", ""},
		"a user name as long as the exact prefix":               {"system:serviceaccount:kube-system", nil, "", "secrets", "default", ""},
		"an exact service account":                              {"system:serviceaccount:ops:runner", nil, "", "secrets", "default", "ops-runner"},
		"another name in the exact namespace":                   {"system:serviceaccount:ops:runner2", nil, "", "secrets", "default", ""},
		"a user, not a service account, of the same name":       {"xystem:serviceaccount:ops:runner", nil, "", "secrets", "default", ""},
		"a user on a matching resource by prefix":               {"alice", nil, "apps", "replicasets", "x", "alice-apps"},
		"a user on another group falls through":                 {"alice", nil, "", "deployments", "team-a", "team-namespaces"},
		"ties are broken by name":                               {"alice", nil, "apps", "deployments", "", "aardvark"},
		"an all-namespace watch matches the empty namespace":    {"carol", nil, "", "pods", "", "cluster-wide-pods"},
		"a namespaced watch does not match the empty namespace": {"carol", nil, "", "pods", "default", ""},
	} {
		t.Run(name, func(t *testing.T) {
			got := ""
			if b := p.Match(tc.user, tc.groups, tc.group, tc.resource, tc.namespace); b != nil {
				got = b.Name
			}
			if got != tc.want {
				t.Errorf("Match = %q, want %q", got, tc.want)
			}
		})
	}
	var none *Policy
	if none.Match("a", nil, "", "pods", "") != nil {
		t.Error("a nil policy matched")
	}
}
