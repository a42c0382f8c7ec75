package inject

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/watchgate/watchgate/internal/periodic"
)

// CASource is watchgate's CA bundle: read from a file (--ca-file, the
// serving Secret's ca.crt in the chart) and re-read every Interval, or a
// fixed bundle (the generated pair's certificate). Safe for concurrent use.
type CASource struct {
	// File is the PEM bundle; empty with Static set.
	File string
	// Static is the bundle when File is empty.
	Static []byte
	// Interval is how often File is re-read; default 10 s. A Secret volume
	// is updated by the kubelet within about a minute of the Secret.
	Interval time.Duration
	// Clock times the re-reads; default the real clock. For tests.
	Clock clock.Clock

	mu      sync.Mutex
	current []byte
	changed chan event.GenericEvent
}

// Load reads the bundle once and keeps its certificates: only its
// CERTIFICATE blocks, each parsed, are published (a private key or any
// other block that shares the file never is).
func (s *CASource) Load() ([]byte, error) {
	b := s.Static
	if s.File != "" {
		var err error
		if b, err = os.ReadFile(s.File); err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
	}
	b, err := certificatesOf(b)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = b
	return b, nil
}

// Current is the last bundle loaded.
func (s *CASource) Current() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

// Events is where a change of the bundle is announced (one generic event).
func (s *CASource) Events() chan event.GenericEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan event.GenericEvent, 1)
	}
	return s.changed
}

// Start re-reads File until ctx ends; a Runnable on every replica (the
// publisher that listens is leader-only, and a missed event is caught by
// its next reconcile).
func (s *CASource) Start(ctx context.Context) error {
	if s.File == "" {
		<-ctx.Done()
		return nil
	}
	d := s.Interval
	if d <= 0 {
		d = 10 * time.Second
	}
	clk := s.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	ch := s.Events()
	periodic.Every(ctx, clk, d, func(context.Context) {
		prev := s.Current()
		b, err := s.Load()
		if err != nil || bytes.Equal(b, prev) {
			return // a half-written file: keep the last good bundle
		}
		select {
		case ch <- event.GenericEvent{}:
		default:
		}
	})
	return nil
}

// NeedLeaderElection is false: every replica reads its own file.
func (s *CASource) NeedLeaderElection() bool { return false }

// certificatesOf is the CERTIFICATE blocks of the PEM bundle b, re-encoded
// without their headers or the text around them.
func certificatesOf(b []byte) ([]byte, error) {
	var out bytes.Buffer
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return nil, fmt.Errorf("CA bundle: %w", err)
		}
		if err := pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: blk.Bytes}); err != nil {
			return nil, err
		}
	}
	if out.Len() == 0 {
		return nil, errors.New("CA bundle holds no PEM certificate")
	}
	return out.Bytes(), nil
}
