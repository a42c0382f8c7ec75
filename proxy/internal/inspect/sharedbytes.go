package inspect

import "sync"

// SharedBytes is a count of bytes that many holders share, each under a
// key (the caller whose watch holds them), safe for concurrent use. A take
// succeeds while the total stays within limit and the key's bytes within
// perKey, so that no caller can take what the replica has for everyone:
// the others still find their share when one has spent its own.
//
// Only keys that hold bytes have an entry, so it holds at most one entry
// per holder.
type SharedBytes struct {
	limit, perKey int64

	mu    sync.Mutex
	used  int64
	byKey map[string]int64
}

// NewSharedBytes returns a SharedBytes of limit bytes in all, at most
// perKey of them under one key.
func NewSharedBytes(limit, perKey int64) *SharedBytes {
	return &SharedBytes{limit: limit, perKey: perKey, byKey: map[string]int64{}}
}

// take takes n bytes for key, or nothing and false when the total or the
// key's share has not n left.
func (b *SharedBytes) take(key string, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.byKey[key]
	if b.used+int64(n) > b.limit || k+int64(n) > b.perKey {
		return false
	}
	b.used += int64(n)
	b.byKey[key] = k + int64(n)
	return true
}

// give returns n bytes key took.
func (b *SharedBytes) give(key string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= int64(n)
	if k := b.byKey[key] - int64(n); k > 0 {
		b.byKey[key] = k
	} else {
		delete(b.byKey, key)
	}
}

// InUse is the bytes taken and not given back.
func (b *SharedBytes) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
