package proxy

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/admit"
	"github.com/watchgate/watchgate/proxy/internal/enginetest"
	"github.com/watchgate/watchgate/proxy/internal/streamtest"
)

// initialEventsEndFrame is the bookmark that ends a watch-list's initial
// events, in JSON.
var initialEventsEndFrame = []byte(`{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"43","creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}}}}` + "\n")

// A watch that asks for initial state holds its seat among the watch opens
// in flight until that state has passed, not only until its headers: with
// one seat, the next open reaches the API server only once the first
// watch's stream has been quiet for the gap, its watch-list bookmark that
// ends the initial events went by, or it ended.
func TestInitialStateHoldsItsWatchOpenSeat(t *testing.T) {
	const watchList = "/api/v1/namespaces/ns/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
	for name, tc := range map[string]struct {
		path string
		gap  time.Duration // how long a quiet stream takes to count as initialized
		// held: the second open must wait until the test ends the first
		// watch's initial state: with its bookmark, or else by leaving.
		held, bookmark bool
	}{
		"a watch-list, until its end bookmark":      {path: watchList, gap: time.Hour, held: true, bookmark: true},
		"a get-state watch, until it ends":          {path: "/api/v1/namespaces/ns/configmaps?watch=true", gap: time.Hour, held: true},
		"a get-state watch, until its events pause": {path: "/api/v1/namespaces/ns/configmaps?watch=true"},
		"a watch-list, until its events pause":      {path: watchList},
		"a watch from a version, until its headers": {path: staleWatchURL, gap: time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			proceed := make(chan struct{})
			var arrived atomic.Int32 // watch opens the API server got
			secondArrived := make(chan struct{})
			up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := arrived.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				if n > 1 {
					close(secondArrived)
					<-r.Context().Done()
					return
				}
				_, _ = w.Write(streamtest.JSONFrames()[0]) // an event of the initial state
				w.(http.Flusher).Flush()
				select {
				case <-proceed:
				case <-r.Context().Done():
					return
				}
				_, _ = w.Write(initialEventsEndFrame)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			})
			upstream := httptest.NewServer(up)
			t.Cleanup(upstream.Close)
			adm := &admit.Admission{Engine: &enginetest.Engine{}, MaxDelay: 50 * time.Millisecond,
				Seats: admit.NewWatchOpenSeats(1, clock.RealClock{}), InitSeatGap: tc.gap}
			px := newTestAdmission(t, adm, &rest.Config{Host: upstream.URL})
			client := &http.Client{Transport: &http.Transport{}}
			t.Cleanup(client.CloseIdleConnections) // before the servers close

			first := openStream(t, client, px.URL+tc.path, "alice")
			if first == nil {
				return
			}
			t.Cleanup(func() { _ = first.Body.Close() })
			if _, err := bufio.NewReader(first.Body).ReadString('\n'); err != nil {
				t.Fatalf("the first watch's first event: %v", err)
			}
			second := make(chan *http.Response, 1)
			go func() { second <- openStream(t, client, px.URL+staleWatchURL, "agent") }()
			t.Cleanup(func() {
				if resp := <-second; resp != nil {
					_ = resp.Body.Close()
				}
			})
			if tc.held {
				// However long the first's initial state lasts, the second
				// open waits for the seat.
				time.Sleep(200 * time.Millisecond)
				if n := arrived.Load(); n != 1 {
					t.Fatalf("the API server got %d watch opens while the first watch's initial state had not passed, want 1 (one seat)", n)
				}
				if tc.bookmark {
					close(proceed)
				} else {
					_ = first.Body.Close()
				}
			}
			select {
			case <-secondArrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the second watch open never reached the API server")
			}
		})
	}
}

// openStream opens path with token and returns the response once its
// headers are in.
func openStream(t *testing.T, client *http.Client, url, token string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Error(err)
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return resp
}
