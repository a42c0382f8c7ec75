package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/watchgate/watchgate/test/apiserver"
)

// streamsPerConnection is the HTTP/2 stream limit the upstream tests give
// kube-apiserver (--http2-max-streams-per-connection; 100 by default), small
// so that the tests open few watches.
const streamsPerConnection = 20

// Watches from many callers share the proxy's HTTP/2 connections to the
// API server, which allows so many streams per connection. More watches
// than one connection allows are all served at once (each gets its 200 and
// the next event; none waits for a stream to end), over more connections;
// and a client that never reads its watch does not stall the other
// watches on its connection.
func TestUpstreamConnections(t *testing.T) {
	ctx := context.Background()
	up, err := apiserver.Start(apiserver.Options{Args: map[string]string{
		"http2-max-streams-per-connection": fmt.Sprint(streamsPerConnection),
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Stop() })
	sa, _, srv, url, ca, _ := agentOn(t, up, "upstream")
	ns := sa.Namespace
	cfg := up.ConfigFor(sa.Token, url, ca)
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.CloseIdleConnections)
	admin := up.Clientset.CoreV1().ConfigMaps(ns)
	path := strings.TrimSuffix(url, "/") + "/api/v1/namespaces/" + ns + "/configmaps?watch=true&timeoutSeconds=120&resourceVersion="

	// open starts a watch from the current version and returns a reader
	// of its events once its 200 came.
	open := func(ctx context.Context) (*json.Decoder, error) {
		l, err := admin.List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, path+l.ResourceVersion, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		context.AfterFunc(ctx, func() { resp.Body.Close() })
		return json.NewDecoder(bufio.NewReader(resp.Body)), nil
	}
	type event struct {
		Type   string           `json:"type"`
		Object corev1.ConfigMap `json:"object"`
	}

	t.Run("a client that does not read stalls no other watch on its connection", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if _, err := open(wctx); err != nil { // never read
			t.Fatal(err)
		}
		reader, err := open(wctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := srv.UpstreamConnections(); n != 1 {
			t.Fatalf("%d upstream connections, want the two watches on one", n)
		}
		// 24 objects of 700 KB: more than the client's, the proxy's and
		// the API server's buffers for the stalled watch together.
		const objects = 24
		big := strings.Repeat("x", 700<<10)
		go func() {
			for i := range objects {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("big-%d", i)}, Data: map[string]string{"v": big}}
				if _, err := admin.Create(wctx, cm, metav1.CreateOptions{}); err != nil {
					return
				}
			}
		}()
		seen := 0
		deadline := time.AfterFunc(90*time.Second, cancel)
		defer deadline.Stop()
		for seen < objects {
			var ev event
			if err := reader.Decode(&ev); err != nil {
				t.Fatalf("the reading watch got %d of %d events, then: %v", seen, objects, err)
			}
			if strings.HasPrefix(ev.Object.Name, "big-") {
				seen++
			}
		}
	})
	t.Run("more watches than one connection allows are served at once", func(t *testing.T) {
		const watches = 3*streamsPerConnection + 5
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		decoders := make([]*json.Decoder, watches)
		errs := make([]error, watches)
		// Each watch's 200 must come long before any watch could end
		// (timeoutSeconds=120) and free a stream for it.
		watchdog := time.AfterFunc(60*time.Second, cancel)
		var wg sync.WaitGroup
		for i := range watches {
			wg.Go(func() { decoders[i], errs[i] = open(wctx) })
		}
		wg.Wait()
		watchdog.Stop()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("watch %d: %v", i, err)
			}
		}
		conns := srv.UpstreamConnections()
		t.Logf("%d watches over %d upstream connections at %d streams per connection", watches, conns, streamsPerConnection)
		if min := watches / streamsPerConnection; conns < min+1 {
			t.Errorf("%d upstream connections for %d watches at %d streams each, want at least %d", conns, watches, streamsPerConnection, min+1)
		}
		if _, err := admin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hello"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got := make([]string, watches)
		for i, d := range decoders {
			wg.Go(func() {
				var ev event
				if err := d.Decode(&ev); err == nil {
					got[i] = ev.Type + " " + ev.Object.Name
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cancel()
			<-done
		}
		for i, g := range got {
			if g != "ADDED hello" {
				t.Errorf("watch %d got %q, want ADDED hello", i, g)
			}
		}
	})

}
