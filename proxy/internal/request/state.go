package request

import (
	"context"
	"net/http"

	"k8s.io/apiserver/pkg/authentication/user"
)

// State is what the filters learn about a request, each filling in
// its own field for the filters after it: who the token belongs to, whose
// budget the request spends, its classification, and, for an admitted
// watch, its relay.Watch. It rides in the request's context once, put there
// by the first filter that learns something: a context value and a copy of
// the request per filter would cost every request (and every open watch,
// which keeps them) a few hundred bytes more.
//
// Only the request's own goroutine touches it (the filters, and the
// reverse proxy's ModifyResponse and ErrorHandler, run there).
type State struct {
	Caller         user.Info // who the token belongs to; nil before authentication
	Identity       user.Info // whose budget the request spends, when impersonating; nil: the caller
	classification *Classification
	Watch          AdmittedWatch // an admitted watch; nil for every other request
	// relayAtTop is set by relay.WithRelayAtTop, the chain's first filter: an
	// admitted watch then leaves its stream's relay, and the end of the
	// watch, in relay for that filter to run once every filter below it
	// has returned: relay(true) relays the stream, then ends the watch;
	// relay(false), for a filter that panicked on the way back, closes the
	// stream unrelayed and ends the watch.
	RelayAtTop bool
	Relay      func(stream bool)
}

// AdmittedWatch is an admitted watch, as the forwarder sees it.
type AdmittedWatch interface {
	// UpstreamAnswered sees the API server's response before the
	// reverse proxy sends its headers.
	UpstreamAnswered(resp *http.Response)
	// UpstreamFailed learns that the API server did not answer; it
	// reports whether the proxy itself closed the watch (shutdown).
	UpstreamFailed() (stoppedByProxy bool)
}

type stateKey struct{}

// WithState returns ctx carrying s.
func WithState(ctx context.Context, s *State) context.Context {
	return context.WithValue(ctx, stateKey{}, s)
}

func requestStateFrom(ctx context.Context) *State {
	s, _ := ctx.Value(stateKey{}).(*State)
	return s
}

// StateOf returns r's State and r, or a new state and a copy of r
// that carries it when r has none.
func StateOf(r *http.Request) (*State, *http.Request) {
	if s := requestStateFrom(r.Context()); s != nil {
		return s, r
	}
	s := &State{}
	return s, r.WithContext(WithState(r.Context(), s))
}

// CallerFrom returns the authenticated caller, false before
// authentication.
func CallerFrom(ctx context.Context) (user.Info, bool) {
	if s := requestStateFrom(ctx); s != nil && s.Caller != nil {
		return s.Caller, true
	}
	return nil, false
}

// CallerName is the caller's user name, "" before authentication.
func CallerName(ctx context.Context) string {
	if u, ok := CallerFrom(ctx); ok {
		return u.GetName()
	}
	return ""
}

// ImpersonatedFrom reports whether the budget identity is an impersonated
// one (identity.WithBudgetIdentity honoured the headers).
func ImpersonatedFrom(ctx context.Context) bool {
	s := requestStateFrom(ctx)
	return s != nil && s.Identity != nil
}

// IdentityFrom returns the budget identity, falling back to the caller.
func IdentityFrom(ctx context.Context) (user.Info, bool) {
	if s := requestStateFrom(ctx); s != nil && s.Identity != nil {
		return s.Identity, true
	}
	return CallerFrom(ctx)
}

// ClassificationFrom returns the request's classification, false before
// the request was classified.
func ClassificationFrom(ctx context.Context) (*Classification, bool) {
	if s := requestStateFrom(ctx); s != nil && s.classification != nil {
		return s.classification, true
	}
	return nil, false
}

// AdmittedWatchFrom returns the state of the admitted watch the request
// is, nil for every other request.
func AdmittedWatchFrom(ctx context.Context) AdmittedWatch {
	if s := requestStateFrom(ctx); s != nil {
		return s.Watch
	}
	return nil
}
