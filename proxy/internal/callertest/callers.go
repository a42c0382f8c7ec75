package callertest

import (
	"context"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"

	"github.com/watchgate/watchgate/proxy/internal/request"
)

var (
	// Alice is a user of the dev group.
	Alice = &user.DefaultInfo{Name: "alice", Groups: []string{"dev", user.AllAuthenticated}}
	// Agent is a service account, agents/agent.
	Agent = &user.DefaultInfo{Name: "system:serviceaccount:agents:agent", Groups: []string{"system:serviceaccounts", user.AllAuthenticated}}
)

// Tokens knows two tokens: "alice" and "agent".
var Tokens = authenticator.TokenFunc(func(_ context.Context, token string) (*authenticator.Response, bool, error) {
	switch token {
	case "alice":
		return &authenticator.Response{User: Alice}, true, nil
	case "agent":
		return &authenticator.Response{User: Agent}, true, nil
	}
	return nil, false, nil
})

// Impersonation lets the agent impersonate the user bob, the group dev
// and the extra scopes=view; nobody else may impersonate anything.
var Impersonation = authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if a.GetUser().GetName() != Agent.Name || a.GetVerb() != "impersonate" {
		return authorizer.DecisionDeny, "", nil
	}
	switch a.GetResource() + "/" + a.GetSubresource() + "/" + a.GetName() {
	case "users//bob", "groups//dev", "userextras/scopes/view":
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionDeny, "", nil
})

// Access lets alice get every WatchBudget's status, and nobody else
// anything.
var Access = authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if a.GetUser().GetName() == Alice.Name && a.GetVerb() == "get" && a.GetAPIGroup() == "watchgate.io" &&
		a.GetResource() == "watchbudgets" && a.GetSubresource() == "status" {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionDeny, "", nil
})

// WithCaller returns a context whose request state names u as the caller,
// as authn.WithAuthentication leaves it.
func WithCaller(ctx context.Context, u user.Info) context.Context {
	return request.WithState(ctx, &request.State{Caller: u})
}
