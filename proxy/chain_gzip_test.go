package proxy

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
	"github.com/watchgate/watchgate/ratelimit"
)

// gzipUpstream answers a watch as kube-apiserver answers a watch-list to a
// client that accepts gzip, a member per flush, one flush at a time (see
// streamingUpstream).
func gzipUpstream(t *testing.T, contentType string, members [][]byte, proceed <-chan struct{}) http.Handler {
	h := streamingUpstream(t, contentType, members, proceed)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Add("Vary", "Accept-Encoding")
		h.ServeHTTP(w, r)
	})
}

// A watch-list answered with gzip (kube-apiserver's WatchListCompression)
// passes byte for byte, each member as it comes, and its ERROR 410 is
// seen: the engine learns the version and the watch ends as an error.
func TestGzipWatchStreamLearnsStaleVersions(t *testing.T) {
	for name, tc := range map[string]struct {
		contentType string
		frames      [][]byte
	}{
		"json":     {streamtest.JSONWatchType, streamtest.JSONFrames()},
		"protobuf": {streamtest.ProtobufWatchType, streamtest.ProtobufFrames(t)},
	} {
		t.Run(name, func(t *testing.T) {
			members := make([][]byte, len(tc.frames))
			for i, f := range tc.frames {
				members[i] = streamtest.GzipMembers(t, [][]byte{f})
			}
			engine := &enginetest.Engine{}
			proceed := make(chan struct{})
			px := newTestProxy(t, engine, gzipUpstream(t, tc.contentType, members, proceed))
			// The client reads the encoded bytes as they come (no
			// transparent decompression).
			client := px.Client()
			client.Transport.(*http.Transport).DisableCompression = true
			req, _ := http.NewRequest(http.MethodGet, px.URL+staleWatchURL+"&sendInitialEvents=false&resourceVersionMatch=NotOlderThan", nil)
			req.Header.Set("Authorization", "Bearer alice")
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ce := resp.Header.Get("Content-Encoding"); ce != "gzip" {
				t.Fatalf("Content-Encoding %q, want gzip passed through", ce)
			}
			var got []byte
			for i, m := range members {
				buf := make([]byte, len(m))
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					t.Fatalf("member %d: %v", i, err)
				}
				got = append(got, buf...)
				if i < len(members)-1 {
					proceed <- struct{}{}
				}
			}
			rest, _ := io.ReadAll(resp.Body)
			if want := bytes.Join(members, nil); !bytes.Equal(append(got, rest...), want) {
				t.Errorf("client got %d bytes, want the upstream's %d bytes unchanged", len(got)+len(rest), len(want))
			}
			ended := engine.WaitEnded(t, 1)
			_, _, stale := engine.Snapshot()
			if !slices.Equal(stale, []string{"/configmaps@42"}) || !slices.Equal(ended, []ratelimit.Outcome{ratelimit.OutcomeError}) {
				t.Errorf("stale %v, ended %v; want [/configmaps@42], [error]", stale, ended)
			}
		})
	}
}
