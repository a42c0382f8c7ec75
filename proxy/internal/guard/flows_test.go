package guard

import (
	"strings"
	"testing"

	"k8s.io/apiserver/pkg/authentication/serviceaccount"
)

// tenantBySplitUsername is TenantOf as kube-apiserver's own parser makes
// it.
func tenantBySplitUsername(caller string) string {
	if ns, _, err := serviceaccount.SplitUsername(caller); err == nil {
		return "serviceaccounts\x00" + ns
	}
	return caller
}

// TenantOf finds a service account's namespace exactly where
// serviceaccount.SplitUsername does, and nowhere else.
func TestTenantOfAgreesWithSplitUsername(t *testing.T) {
	for _, caller := range []string{
		"system:serviceaccount:team-a:builder",
		"system:serviceaccount:team-a:builder.v2",
		"system:serviceaccount:team-a:builder:extra",
		"system:serviceaccount:team-a:",
		"system:serviceaccount::builder",
		"system:serviceaccount:Team-A:builder",
		"system:serviceaccount:team-a:Builder",
		"system:serviceaccount:-team:builder",
		"system:serviceaccount:team-:builder",
		"system:serviceaccount:team.a:builder",
		"system:serviceaccount:team-a:builder.",
		"system:serviceaccount:team-a:.builder",
		"system:serviceaccount:team-a:a..b",
		"system:serviceaccount:team-a:a-.b",
		"system:serviceaccount:" + strings.Repeat("a", 63) + ":b",
		"system:serviceaccount:" + strings.Repeat("a", 64) + ":b",
		"system:serviceaccount:ns:" + strings.Repeat("a", 253),
		"system:serviceaccount:ns:" + strings.Repeat("a", 254),
		"system:serviceaccount:ns:" + strings.Repeat("a.", 126) + "a",
		"system:serviceaccount:team-a",
		"system:serviceaccounts:team-a",
		"system:serviceaccount:team a:builder",
		"system:serviceaccount:team_a:builder",
		"system:serviceaccount:tëam:builder",
		"alice",
		"",
	} {
		if got, want := TenantOf(caller), tenantBySplitUsername(caller); got != want {
			t.Errorf("TenantOf(%q) = %q, want %q", caller, got, want)
		}
	}
}

func FuzzTenantOf(f *testing.F) {
	f.Add("system:serviceaccount:team-a:builder")
	f.Add("system:serviceaccount:a.b:c..d")
	f.Fuzz(func(t *testing.T, caller string) {
		if got, want := TenantOf(caller), tenantBySplitUsername(caller); got != want {
			t.Errorf("TenantOf(%q) = %q, want %q", caller, got, want)
		}
	})
}
