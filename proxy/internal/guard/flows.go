package guard

import "k8s.io/apiserver/pkg/authentication/serviceaccount"

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
	if ns, _, err := serviceaccount.SplitUsername(caller); err == nil {
		return "serviceaccounts\x00" + ns
	}
	return caller
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
