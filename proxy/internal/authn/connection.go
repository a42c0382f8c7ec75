package authn

import "context"

// The connection a request came on is told when the request
// authenticates, so that the listener sheds the connections on which
// nothing ever authenticated first (serve.LimitConnections).

type connectionKey struct{}

// WithConnection returns ctx carrying authenticated, which
// WithAuthentication calls for every request it lets through: one that
// authenticated, or one forwarded although its review failed
// (review.FailOpen).
func WithConnection(ctx context.Context, authenticated func()) context.Context {
	return context.WithValue(ctx, connectionKey{}, authenticated)
}

// connectionAuthenticated tells the request's connection, if it asked
// (WithConnection), that a request on it authenticated.
func connectionAuthenticated(ctx context.Context) {
	if f, ok := ctx.Value(connectionKey{}).(func()); ok {
		f()
	}
}
