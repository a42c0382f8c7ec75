package proxy

import (
	"context"

	"k8s.io/apiserver/pkg/authentication/user"
)

// Each filter leaves what it learned in the request's context for the next.
type contextKey int

const (
	callerKey         contextKey = iota // user.Info: who the token belongs to
	identityKey                         // user.Info: whose budget the request spends
	classificationKey                   // *classification
	admittedWatchKey                    // *watchState of an admitted watch
)

func withCaller(ctx context.Context, u user.Info) context.Context {
	return context.WithValue(ctx, callerKey, u)
}

func callerFrom(ctx context.Context) (user.Info, bool) {
	u, ok := ctx.Value(callerKey).(user.Info)
	return u, ok
}

func withIdentity(ctx context.Context, u user.Info) context.Context {
	return context.WithValue(ctx, identityKey, u)
}

// impersonatedFrom reports whether the budget identity is an impersonated
// one (withBudgetIdentity honoured the headers).
func impersonatedFrom(ctx context.Context) bool {
	_, ok := ctx.Value(identityKey).(user.Info)
	return ok
}

// identityFrom returns the budget identity, falling back to the caller.
func identityFrom(ctx context.Context) (user.Info, bool) {
	if u, ok := ctx.Value(identityKey).(user.Info); ok {
		return u, true
	}
	return callerFrom(ctx)
}

func withClassificationValue(ctx context.Context, c *classification) context.Context {
	return context.WithValue(ctx, classificationKey, c)
}

func classificationFrom(ctx context.Context) (*classification, bool) {
	c, ok := ctx.Value(classificationKey).(*classification)
	return c, ok
}

func withAdmittedWatch(ctx context.Context, w *watchState) context.Context {
	return context.WithValue(ctx, admittedWatchKey, w)
}

// admittedWatchFrom returns the state of the admitted watch the request
// is, nil for every other request.
func admittedWatchFrom(ctx context.Context) *watchState {
	w, _ := ctx.Value(admittedWatchKey).(*watchState)
	return w
}
