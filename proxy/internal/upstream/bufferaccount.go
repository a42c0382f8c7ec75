package upstream

import "context"

// BufferAccount is told how many bytes of a forwarded response wait in the
// proxy for its client (guard.Stream): the watch client reports the
// bytes a stream has received and the relay not yet read.
type BufferAccount interface {
	// AddBuffered counts delta more bytes held (fewer when negative).
	AddBuffered(delta int)
}

type bufferAccountKey struct{}

// WithBufferAccount returns ctx carrying a, for a request whose response's
// bytes are accounted. Such a GET goes over the watch client, whose
// streams report to a and open a small window that grows while the client
// reads (watchConnStream).
func WithBufferAccount(ctx context.Context, a BufferAccount) context.Context {
	return context.WithValue(ctx, bufferAccountKey{}, a)
}

// BufferAccountFrom returns the account ctx carries, nil when none.
func BufferAccountFrom(ctx context.Context) BufferAccount {
	a, _ := ctx.Value(bufferAccountKey{}).(BufferAccount)
	return a
}
