package proxy

import (
	"bufio"
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/watchgate/watchgate/proxy/internal/answer"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
	"github.com/watchgate/watchgate/ratelimit"
)

const staleWatchURL = "/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=42"

// streamingUpstream answers a watch with frames, one at a time: it writes
// frame i+1 only after the test saw frame i arrive (proceed), which fails
// if anything between them holds the stream back.
func streamingUpstream(t *testing.T, contentType string, frames [][]byte, proceed <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(200)
		for i, f := range frames {
			if i > 0 {
				select {
				case <-proceed:
				case <-time.After(5 * time.Second):
					t.Errorf("frame %d was not delivered before frame %d was written: the stream is buffered", i-1, i)
					return
				}
			}
			_, _ = w.Write(f)
			w.(http.Flusher).Flush()
		}
	})
}

// A 410 in the stream, in JSON or protobuf, teaches the engine the stale
// version, while every byte reaches the client unchanged and at once; the
// watch ends once, as an error.
func TestWatchStreamLearnsStaleVersions(t *testing.T) {
	for name, tc := range map[string]struct {
		contentType string
		frames      [][]byte
	}{
		"json":     {"application/json", streamtest.JSONFrames()},
		"protobuf": {"application/vnd.kubernetes.protobuf;stream=watch", streamtest.ProtobufFrames(t)},
	} {
		t.Run(name, func(t *testing.T) {
			engine := &enginetest.Engine{}
			proceed := make(chan struct{})
			px := newTestProxy(t, engine, streamingUpstream(t, tc.contentType, tc.frames, proceed))
			req, _ := http.NewRequest(http.MethodGet, px.URL+staleWatchURL, nil)
			req.Header.Set("Authorization", "Bearer alice")
			resp, err := px.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var got []byte
			for i, f := range tc.frames {
				buf := make([]byte, len(f))
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				got = append(got, buf...)
				if i < len(tc.frames)-1 {
					proceed <- struct{}{}
				}
			}
			rest, _ := io.ReadAll(resp.Body)
			if want := bytes.Join(tc.frames, nil); !bytes.Equal(append(got, rest...), want) {
				t.Errorf("client got %q, want the upstream's bytes %q", append(got, rest...), want)
			}
			ended := engine.WaitEnded(t, 1)
			_, _, stale := engine.Snapshot()
			if !slices.Equal(stale, []string{"/configmaps@42"}) || !slices.Equal(ended, []ratelimit.Outcome{ratelimit.OutcomeError}) {
				t.Errorf("stale %v, ended %v; want [/configmaps@42], [error]", stale, ended)
			}
		})
	}
}

func TestWatchEnds(t *testing.T) {
	t.Run("a garbage stream passes byte for byte and ends as closed", func(t *testing.T) {
		garbage := make([]byte, 256<<10)
		r := rand.New(rand.NewPCG(1, 2))
		for i := range garbage {
			garbage[i] = byte(r.IntN(256))
		}
		engine := &enginetest.Engine{}
		px := newTestProxy(t, engine, streamingUpstream(t, "application/vnd.kubernetes.protobuf;stream=watch", [][]byte{garbage}, nil))
		if _, body := get(t, px, "alice", staleWatchURL); !bytes.Equal(body, garbage) {
			t.Errorf("client got %d bytes, want the upstream's %d unchanged", len(body), len(garbage))
		}
		ended := engine.WaitEnded(t, 1)
		if _, _, stale := engine.Snapshot(); len(stale) != 0 || !slices.Equal(ended, []ratelimit.Outcome{ratelimit.OutcomeClosed}) {
			t.Errorf("stale %v, ended %v; want none, [closed]", stale, ended)
		}
	})

	t.Run("a client that leaves mid-stream ends the watch once, as closed, and the upstream request", func(t *testing.T) {
		engine := &enginetest.Engine{}
		upstreamDone := make(chan struct{})
		px := newTestProxy(t, engine, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer close(upstreamDone)
			w.Header().Set("Content-Type", "application/json")
			for {
				_, _ = w.Write(streamtest.JSONFrames()[0])
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}))
		req, _ := http.NewRequest(http.MethodGet, px.URL+staleWatchURL, nil)
		req.Header.Set("Authorization", "Bearer alice")
		resp, err := px.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		px.Client().Transport.(*http.Transport).CloseIdleConnections()
		select {
		case <-upstreamDone:
		case <-time.After(5 * time.Second):
			t.Fatal("the upstream request outlived the client")
		}
		if ended := engine.WaitEnded(t, 1); !slices.Equal(ended, []ratelimit.Outcome{ratelimit.OutcomeClosed}) {
			t.Errorf("ended %v, want [closed]", ended)
		}
	})

	t.Run("an upstream that dies mid-stream ends the watch as an error", func(t *testing.T) {
		engine := &enginetest.Engine{}
		px := newTestProxy(t, engine, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(streamtest.JSONFrames()[0])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}))
		req, _ := http.NewRequest(http.MethodGet, px.URL+staleWatchURL, nil)
		req.Header.Set("Authorization", "Bearer alice")
		if resp, err := px.Client().Do(req); err == nil {
			_, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		if ended := engine.WaitEnded(t, 1); !slices.Equal(ended, []ratelimit.Outcome{ratelimit.OutcomeError}) {
			t.Errorf("ended %v, want [error]", ended)
		}
	})

	t.Run("an error answer ends the watch as an error, a 401 or 403 as denied", func(t *testing.T) {
		for code, want := range map[int]ratelimit.Outcome{
			http.StatusInternalServerError: ratelimit.OutcomeError,
			http.StatusForbidden:           ratelimit.OutcomeDenied,
			http.StatusUnauthorized:        ratelimit.OutcomeDenied,
		} {
			engine := &enginetest.Engine{}
			px := newTestProxy(t, engine, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				answer.WriteStatus(w, r, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: int32(code)}})
			}))
			if resp, _ := get(t, px, "alice", staleWatchURL); resp.StatusCode != code {
				t.Fatalf("HTTP %d, want the upstream's %d", resp.StatusCode, code)
			}
			if ended := engine.WaitEnded(t, 1); !slices.Equal(ended, []ratelimit.Outcome{want}) {
				t.Errorf("upstream %d: ended %v, want [%v]", code, ended, want)
			}
		}
	})
}
