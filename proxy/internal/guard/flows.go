package guard

import (
	"strings"

	"k8s.io/apiserver/pkg/authentication/serviceaccount"
)

// Flow is where a watch sits in the replica's fairness tree, as API
// Priority and Fairness's flow distinguishers place a request:
//
//	replica
//	└── tenant    a namespace's service accounts together; any other caller alone
//	    └── caller    the authenticated identity (one service account, one user)
//	        └── user      the identity an impersonating caller acts as ("": its own)
//
// A tenant is what costs something to make: a service account is minted
// for free by anyone who may edit its namespace, a namespace is not. An
// impersonated user is not a tenant: it costs its caller nothing to name,
// so it shares its caller's place.
type Flow struct {
	Tenant, Caller, User string
}

// FlowOf is the flow of a watch the authenticated caller opens as user
// (the impersonated identity's name, "" or the caller's own for a watch in
// its own name).
func FlowOf(caller, user string) Flow {
	if user == caller {
		user = ""
	}
	return Flow{Tenant: TenantOf(caller), Caller: caller, User: user}
}

// TenantOf is the tenant of a caller: "serviceaccounts\x00<namespace>" for
// a service account (no user name a token reviewer returns holds a NUL),
// the caller's name otherwise.
func TenantOf(caller string) string {
	if ns, ok := serviceAccountNamespace(caller); ok {
		return "serviceaccounts\x00" + ns
	}
	return caller
}

// serviceAccountNamespace is the namespace serviceaccount.SplitUsername
// finds in a service account's user name, and whether it finds one: the
// same checks (a DNS-1123 label, then a DNS-1123 subdomain), without its
// regular expressions, which cost a watch open more than the rest of the
// guard (TenantOf runs several times per request).
func serviceAccountNamespace(user string) (string, bool) {
	rest, ok := strings.CutPrefix(user, serviceaccount.ServiceAccountUsernamePrefix)
	if !ok {
		return "", false
	}
	ns, name, ok := strings.Cut(rest, serviceaccount.ServiceAccountUsernameSeparator)
	if !ok || strings.Contains(name, serviceaccount.ServiceAccountUsernameSeparator) {
		return "", false
	}
	return ns, len(ns) <= 63 && isDNS1123Label(ns) && len(name) <= 253 && isDNS1123Subdomain(name)
}

// isDNS1123Label matches [a-z0-9]([-a-z0-9]*[a-z0-9])?, whatever its length.
func isDNS1123Label(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// isDNS1123Subdomain matches DNS-1123 labels joined by dots, whatever its
// length.
func isDNS1123Subdomain(s string) bool {
	for label := range strings.SplitSeq(s, ".") {
		if !isDNS1123Label(label) {
			return false
		}
	}
	return true
}

// tenantHold is what one tenant holds: its watches, and those of each of
// its callers holding any.
type tenantHold struct {
	held    int64
	callers map[string]*callerHold
}

// callerHold is what one caller holds: its watches, and those of each user
// it impersonates holding any (its own watches are counted in held only).
type callerHold struct {
	held  int64
	users map[string]int64
}
