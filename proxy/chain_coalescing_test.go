package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watchgate/watchgate/proxy/internal/coalesce"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
	"github.com/watchgate/watchgate/ratelimit"
)

// Concurrent watches from one version ask the API server once: when the
// leader's stream says 410, the others get the local answer; when it
// says the version is valid (an event, or a quiet 200), they all go
// upstream.
func TestFollowersWaitForTheLeadersVerdict(t *testing.T) {
	for name, tc := range map[string]struct {
		firstEvent    []byte // what the first upstream watch sends after its headers; nil: nothing
		wantUpstream  int32
		wantLocal410s int
	}{
		"stale: one upstream watch, every follower answered locally": {streamtest.JSONFrames()[2], 1, 4},
		"valid by an event: all go upstream":                         {streamtest.JSONFrames()[0], 5, 0},
		"valid by a quiet stream: all go upstream":                   {nil, 5, 0},
	} {
		t.Run(name, func(t *testing.T) {
			engine := &enginetest.Engine{}
			engine.DecideFunc = func(r *ratelimit.Request) ratelimit.Decision {
				_, _, stale := engine.Snapshot()
				if len(stale) > 0 {
					return ratelimit.Decision{Reason: ratelimit.ReasonStaleResourceVersion, Budget: "b"}
				}
				return ratelimit.Decision{Allowed: true, Budget: "b"}
			}
			var upstream atomic.Int32
			first := make(chan struct{})
			px := newTestProxy(t, engine, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := upstream.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(200)
				w.(http.Flusher).Flush()
				if n == 1 {
					<-first // the followers are waiting by now
					if tc.firstEvent != nil {
						_, _ = w.Write(tc.firstEvent)
						w.(http.Flusher).Flush()
					} else {
						time.Sleep(3 * coalesce.LeaderQuietWindow) // quiet, and open
					}
				}
			}))
			var wg sync.WaitGroup
			bodies := make([]string, 5)
			wg.Go(func() {
				_, body := get(t, px, "alice", staleWatchURL)
				bodies[0] = string(body)
			})
			deadline := time.Now().Add(5 * time.Second)
			for upstream.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			for i := 1; i < 5; i++ {
				wg.Go(func() {
					_, body := get(t, px, "alice", staleWatchURL+"&timeoutSeconds=1")
					bodies[i] = string(body)
				})
			}
			// Whether the followers join before the verdict or come after it, the
			// outcome is the same; the pause only makes the first case likely.
			time.Sleep(50 * time.Millisecond)
			close(first)
			wg.Wait()
			if got := upstream.Load(); got != tc.wantUpstream {
				t.Errorf("%d upstream watches, want %d", got, tc.wantUpstream)
			}
			local := 0
			for _, b := range bodies[1:] {
				if strings.Contains(b, "answered by watchgate") {
					local++
				}
			}
			if local != tc.wantLocal410s {
				t.Errorf("%d followers answered locally, want %d (bodies %q)", local, tc.wantLocal410s, bodies)
			}
		})
	}
}

// When the leader from a stale version learns nothing (its client
// left before the API server answered, the API server failed it), its
// followers do not all go upstream: one of them asks in its place and the
// others wait for that one's verdict.
func TestFollowersOfALeaderThatLearntNothingAskOnce(t *testing.T) {
	for name, firstAnswer := range map[string]func(w http.ResponseWriter, r *http.Request){
		"its client left before the answer": func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		},
		"the API server answered 503": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		},
	} {
		t.Run(name, func(t *testing.T) {
			engine := &enginetest.Engine{}
			engine.DecideFunc = func(r *ratelimit.Request) ratelimit.Decision {
				if _, _, stale := engine.Snapshot(); len(stale) > 0 {
					return ratelimit.Decision{Reason: ratelimit.ReasonStaleResourceVersion, Budget: "b"}
				}
				return ratelimit.Decision{Allowed: true, Budget: "b"}
			}
			var upstream atomic.Int32
			answer := make(chan struct{})
			px := newTestProxy(t, engine, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if upstream.Add(1) == 1 {
					<-answer // the followers are waiting by now
					firstAnswer(w, r)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(200)
				_, _ = w.Write(streamtest.JSONFrames()[2])
			}))
			ctx, leave := context.WithCancel(context.Background())
			defer leave()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, px.URL+staleWatchURL, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer alice")
			firstDone := make(chan struct{})
			go func() {
				defer close(firstDone)
				if resp, err := px.Client().Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			deadline := time.Now().Add(5 * time.Second)
			for upstream.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			var wg sync.WaitGroup
			bodies := make([]string, 4)
			for i := range bodies {
				wg.Go(func() {
					_, body := get(t, px, "alice", staleWatchURL)
					bodies[i] = string(body)
				})
			}
			time.Sleep(50 * time.Millisecond) // let the followers join
			if name == "its client left before the answer" {
				leave()
			}
			close(answer)
			wg.Wait()
			<-firstDone
			if got := upstream.Load(); got != 2 {
				t.Errorf("%d upstream watches, want 2 (the leader and one follower in its place)", got)
			}
			local := 0
			for _, b := range bodies {
				if strings.Contains(b, "answered by watchgate") {
					local++
				}
			}
			if local != 3 {
				t.Errorf("%d followers answered locally, want 3 (bodies %q)", local, bodies)
			}
		})
	}
}
