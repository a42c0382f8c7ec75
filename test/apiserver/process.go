package apiserver

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// LockedBuffer collects a process's stdout and stderr while a test reads
// them. The zero value is ready to use; it is safe for concurrent use.
type LockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// WaitWhileRunning polls cond every 250 ms until it holds, for a process
// the test started (watchgate): it fails the test when the process exits
// first (exited is closed, *waitErr says how) or when timeout passes.
func WaitWhileRunning(t testing.TB, exited <-chan struct{}, waitErr *error, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		select {
		case <-exited:
			t.Fatalf("watchgate exited while waiting for %s: %v", what, *waitErr)
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, timeout)
		}
	}
}
