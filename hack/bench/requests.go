package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// target is one of the three ways to the API server.
type target struct {
	name string
	host string            // https://host:port
	rt   http.RoundTripper // carries the bench client's bearer token
	// proc is the proxy's process; nil for direct.
	proc *process
	// pprof is the address of the proxy's /debug/pprof/ server.
	pprof string
	// metrics is the address of watchgate's /metrics; empty for the others.
	metrics string
	// decisionHeader, when set, must be in an allow decision on every
	// watch answer (watchgate names its decision and budget), proving the
	// budget decided it.
	decisionHeader string
}

const (
	mediaJSON  = "application/json"
	mediaProto = "application/vnd.kubernetes.protobuf;stream=watch"
	// requestTimeout bounds any single request of the harness.
	requestTimeout = 2 * time.Minute
)

func (t *target) do(ctx context.Context, path string, q url.Values, accept string) (*http.Response, error) {
	u := t.host + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("%s: GET %s: %w", t.name, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: GET %s: HTTP %d (%s): %s", t.name, path, resp.StatusCode, resp.Header.Get("X-Watchgate-Decision"), b)
	}
	return resp, nil
}

// get reads one object and returns how long it took, body included.
func (t *target) get(ctx context.Context, path string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	start := time.Now()
	resp, err := t.do(ctx, path, nil, mediaJSON)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return time.Since(start), err
}

// watchOpen opens a watch on collection from rv (a valid, explicit version:
// no initial state) and returns the time until its response headers; then
// it closes the watch.
func (t *target) watchOpen(ctx context.Context, collection, rv string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	start := time.Now()
	resp, err := t.do(ctx, collection, url.Values{"watch": {"true"}, "resourceVersion": {rv}, "timeoutSeconds": {"60"}}, mediaJSON)
	if err != nil {
		return 0, err
	}
	d := time.Since(start)
	cancel()
	resp.Body.Close()
	return d, t.checkDecision(resp)
}

func (t *target) checkDecision(resp *http.Response) error {
	if t.decisionHeader == "" {
		return nil
	}
	got := resp.Header.Get("X-Watchgate-Decision")
	if !strings.HasPrefix(got, "allow") || !strings.Contains(got, t.decisionHeader) {
		return fmt.Errorf("%s: X-Watchgate-Decision %q, want an allow by %q: the bench budget must decide every watch", t.name, got, t.decisionHeader)
	}
	return nil
}

// replay opens a watch on collection with sendInitialEvents=true (a
// streaming list: the watch cache sends every object as an ADDED event,
// then a BOOKMARK marking the end of the initial events) and reads it until
// that bookmark. It returns the ADDED events counted and the time from the
// request to the bookmark. The stream is framed, never decoded: the
// client's own cost stays small next to the proxy's.
func (t *target) replay(ctx context.Context, collection, accept string) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	q := url.Values{"watch": {"true"}, "sendInitialEvents": {"true"}, "resourceVersionMatch": {"NotOlderThan"},
		"allowWatchBookmarks": {"true"}, "timeoutSeconds": {"120"}}
	start := time.Now()
	resp, err := t.do(ctx, collection, q, accept)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if err := t.checkDecision(resp); err != nil {
		return 0, 0, err
	}
	bookmark := []byte("BOOKMARK")
	r := bufio.NewReaderSize(resp.Body, 64<<10)
	events := 0
	var frame []byte
	for {
		frame = frame[:0]
		if accept == mediaJSON {
			// One JSON event per line; a long line arrives in pieces.
			for {
				piece, err := r.ReadSlice('\n')
				frame = append(frame, piece...)
				if errors.Is(err, bufio.ErrBufferFull) {
					continue
				}
				if err != nil {
					return events, 0, fmt.Errorf("%s: replay after %d events: %w", t.name, events, err)
				}
				break
			}
			if bytes.HasPrefix(frame, []byte(`{"type":"BOOKMARK"`)) {
				return events, time.Since(start), nil
			}
		} else {
			// Protobuf watch frames: a 4-byte big-endian length, then the
			// event.
			var n [4]byte
			if _, err := io.ReadFull(r, n[:]); err != nil {
				return events, 0, fmt.Errorf("%s: replay after %d events: %w", t.name, events, err)
			}
			size := binary.BigEndian.Uint32(n[:])
			if size > 16<<20 {
				return events, 0, fmt.Errorf("%s: protobuf frame of %d bytes", t.name, size)
			}
			frame = append(frame, make([]byte, size)...)
			if _, err := io.ReadFull(r, frame); err != nil {
				return events, 0, fmt.Errorf("%s: replay after %d events: %w", t.name, events, err)
			}
			// The event's type is a short string field near the start; an
			// object named like the benchmark's never holds "BOOKMARK".
			if bytes.Contains(frame[:min(len(frame), 64)], bookmark) {
				return events, time.Since(start), nil
			}
		}
		events++
	}
}

// idleWatches holds n open watches on collection from rv, opened with up to
// 32 at a time, until close is called.
type idleWatches struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	rt     http.RoundTripper
}

func (t *target) openIdle(ctx context.Context, rt http.RoundTripper, collection, rv string, n int) (*idleWatches, error) {
	hold, cancel := context.WithCancel(ctx)
	iw := &idleWatches{cancel: cancel, rt: rt}
	tt := *t
	tt.rt = rt
	var g errgroup.Group
	g.SetLimit(32)
	for range n {
		g.Go(func() error {
			resp, err := tt.do(hold, collection, url.Values{"watch": {"true"}, "resourceVersion": {rv}, "timeoutSeconds": {"900"}}, mediaJSON)
			if err != nil {
				return err
			}
			if err := tt.checkDecision(resp); err != nil {
				resp.Body.Close()
				return err
			}
			iw.wg.Add(1)
			go func() {
				defer iw.wg.Done()
				_, _ = io.Copy(io.Discard, resp.Body) // until close cancels it
				resp.Body.Close()
			}()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		iw.close()
		return nil, err
	}
	return iw, nil
}

func (iw *idleWatches) close() {
	iw.cancel()
	iw.wg.Wait()
	if c, ok := iw.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// collectionPath is the path of namespace ns's config maps.
func collectionPath(ns string) string { return "/api/v1/namespaces/" + ns + "/configmaps" }

func objectPath(ns, name string) string {
	return collectionPath(ns) + "/" + strings.TrimPrefix(name, "/")
}
