package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// clientsPerConnection is how many storming clients share one HTTP/2
// connection: kube-apiserver's streams per connection (100), below
// watchgate's (1,000). A client-go transport shared by more clients than
// a server's streams per connection dials a TLS connection for each
// request that finds its connections full and drops those it does not
// need, so that either server would spend the storm on TLS handshakes
// (watchgate's own CPU was over half handshakes at 1,000 clients on one
// transport); spread like this, each client's request has a stream
// waiting on a connection kept open, as a browser's or a dashboard's has.
const clientsPerConnection = 100

// stormClient is one storming client's way to the server: a connection
// it shares with at most clientsPerConnection-1 others.
type stormClient struct {
	rt    http.RoundTripper
	host  string
	token string
}

// stormClients returns n clients of cfg (its host, TLS settings and bearer
// token), over one connection per clientsPerConnection of them.
func stormClients(cfg *rest.Config, n int) ([]stormClient, error) {
	tlsConf, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	var conns []http.RoundTripper
	clients := make([]stormClient, n)
	for i := range clients {
		if i%clientsPerConnection == 0 {
			t := &http.Transport{ForceAttemptHTTP2: true, MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}
			if tlsConf != nil {
				t.TLSClientConfig = tlsConf.Clone()
			}
			conns = append(conns, t)
		}
		clients[i] = stormClient{rt: conns[len(conns)-1], host: strings.TrimRight(cfg.Host, "/"), token: cfg.BearerToken}
	}
	return clients, nil
}

// connect opens each client's connection before the storm (a GET of
// /version, no watch), as a dashboard's is open before it re-subscribes;
// otherwise every client's first request would dial a connection of its
// own.
func connect(ctx context.Context, clients []stormClient) error {
	for i := 0; i < len(clients); i += clientsPerConnection {
		c := clients[i]
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.host+"/version", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := c.rt.RoundTrip(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			return fmt.Errorf("GET /version answered over %s, want HTTP/2", resp.Proto)
		}
	}
	return nil
}

// closeStormClients closes the clients' connections.
func closeStormClients(clients []stormClient) {
	for i := 0; i < len(clients); i += clientsPerConnection {
		clients[i].rt.(*http.Transport).CloseIdleConnections()
	}
}

// resubscription is what one watch of a storming client got.
type resubscription struct {
	httpStatus int
	code       int // the Status code of the answer or of its first ERROR event
}

// watch opens a JSON watch on path from resourceVersion and reads it until
// its first ERROR event, its end, or wait, as apiserver.WatchFor does.
func (c stormClient) watch(ctx context.Context, path, resourceVersion string, wait time.Duration) (resubscription, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	u := c.host + path + "?" + url.Values{"watch": {"true"}, "resourceVersion": {resourceVersion}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return resubscription{}, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.rt.RoundTrip(req)
	if err != nil {
		return resubscription{}, err
	}
	defer resp.Body.Close()
	r := resubscription{httpStatus: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		var st metav1.Status
		_ = json.NewDecoder(resp.Body).Decode(&st)
		r.code = int(st.Code)
		return r, nil
	}
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	for {
		var ev metav1.WatchEvent
		if err := dec.Decode(&ev); err != nil {
			return r, nil // the end, or wait ran out
		}
		if ev.Type == "ERROR" {
			var st metav1.Status
			_ = json.Unmarshal(ev.Object.Raw, &st)
			r.code = int(st.Code)
			return r, nil
		}
	}
}
