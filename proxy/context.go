package proxy

import (
	"context"
	"net/http"

	"k8s.io/apiserver/pkg/authentication/user"
)

// requestState is what the filters learn about a request, each filling in
// its own field for the filters after it: who the token belongs to, whose
// budget the request spends, its classification, and, for an admitted
// watch, its watchState. It rides in the request's context once, put there
// by the first filter that learns something: a context value and a copy of
// the request per filter would cost every request (and every open watch,
// which keeps them) a few hundred bytes more.
//
// Only the request's own goroutine touches it (the filters, and the
// reverse proxy's ModifyResponse and ErrorHandler, run there).
type requestState struct {
	caller         user.Info // who the token belongs to; nil before authentication
	identity       user.Info // whose budget the request spends, when impersonating; nil: the caller
	classification *classification
	watch          *watchState // an admitted watch; nil for every other request
	// relayAtTop is set by withRelayAtTop, the chain's first filter: an
	// admitted watch then leaves its stream's relay, and the end of the
	// watch, in relay for that filter to run once every filter below it
	// has returned: relay(true) relays the stream, then ends the watch;
	// relay(false), for a filter that panicked on the way back, closes the
	// stream unrelayed and ends the watch.
	relayAtTop bool
	relay      func(stream bool)
}

type requestStateKey struct{}

func requestStateFrom(ctx context.Context) *requestState {
	s, _ := ctx.Value(requestStateKey{}).(*requestState)
	return s
}

// stateOf returns r's requestState and r, or a new state and a copy of r
// that carries it when r has none.
func stateOf(r *http.Request) (*requestState, *http.Request) {
	if s := requestStateFrom(r.Context()); s != nil {
		return s, r
	}
	s := &requestState{}
	return s, r.WithContext(context.WithValue(r.Context(), requestStateKey{}, s))
}

func callerFrom(ctx context.Context) (user.Info, bool) {
	if s := requestStateFrom(ctx); s != nil && s.caller != nil {
		return s.caller, true
	}
	return nil, false
}

// callerName is the caller's user name, "" before authentication.
func callerName(ctx context.Context) string {
	if u, ok := callerFrom(ctx); ok {
		return u.GetName()
	}
	return ""
}

// impersonatedFrom reports whether the budget identity is an impersonated
// one (withBudgetIdentity honoured the headers).
func impersonatedFrom(ctx context.Context) bool {
	s := requestStateFrom(ctx)
	return s != nil && s.identity != nil
}

// identityFrom returns the budget identity, falling back to the caller.
func identityFrom(ctx context.Context) (user.Info, bool) {
	if s := requestStateFrom(ctx); s != nil && s.identity != nil {
		return s.identity, true
	}
	return callerFrom(ctx)
}

func classificationFrom(ctx context.Context) (*classification, bool) {
	if s := requestStateFrom(ctx); s != nil && s.classification != nil {
		return s.classification, true
	}
	return nil, false
}

// admittedWatchFrom returns the state of the admitted watch the request
// is, nil for every other request.
func admittedWatchFrom(ctx context.Context) *watchState {
	if s := requestStateFrom(ctx); s != nil {
		return s.watch
	}
	return nil
}
