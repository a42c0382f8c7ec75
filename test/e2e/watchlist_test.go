package e2e

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// watchAnswer is what one raw watch request got: the HTTP status, the
// Content-Encoding, and the first event's type and (for ERROR) Status
// code, or the Status code of a non-200 answer.
type watchAnswer struct {
	HTTPStatus int
	Encoding   string
	FirstType  string
	Code       int32
}

func (a watchAnswer) String() string {
	return fmt.Sprintf("HTTP %d, first event %q code %d", a.HTTPStatus, a.FirstType, a.Code)
}

// rawWatch sends GET path?query with the token to the proxy (p non-nil)
// or directly to the API server, accepting gzip (as client-go does) when
// gzipOK, and reads the answer up to its first event (at most wait).
func rawWatch(t *testing.T, p *testProxy, token, path string, query url.Values, gzipOK bool, wait time.Duration) watchAnswer {
	t.Helper()
	var cfg *rest.Config
	if p != nil {
		cfg = p.Config(token, false)
	} else {
		cfg = env.ConfigFor(token, "", nil)
	}
	cfg.DisableCompression = true // the test reads the encoding itself
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+path+"?"+query.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	if gzipOK {
		req.Header.Set("Accept-Encoding", "gzip")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	ans := watchAnswer{HTTPStatus: resp.StatusCode, Encoding: resp.Header.Get("Content-Encoding")}
	var body io.Reader = resp.Body
	if ans.Encoding == "gzip" {
		zr, err := gzip.NewReader(bufio.NewReader(resp.Body))
		if err != nil {
			if ctx.Err() != nil {
				return ans // no event before the wait ran out
			}
			t.Fatalf("GET %s: gzip: %v", path, err)
		}
		body = zr
	}
	if resp.StatusCode != http.StatusOK {
		var st metav1.Status
		_ = json.NewDecoder(body).Decode(&st)
		ans.Code = st.Code
		return ans
	}
	var ev struct {
		Type   string        `json:"type"`
		Object metav1.Status `json:"object"`
	}
	if err := json.NewDecoder(body).Decode(&ev); err != nil {
		return ans // no event: the stream ended or the wait ran out
	}
	ans.FirstType = ev.Type
	if ev.Type == "ERROR" {
		ans.Code = ev.Object.Code
	}
	return ans
}

// currentVersion is the API server's current resourceVersion for
// configmaps in ns.
func currentVersion(t *testing.T, ns string) string {
	t.Helper()
	l, err := env.Clientset.CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	return l.ResourceVersion
}

// kube-apiserver 1.37 answers a watch-list with gzip when the client
// accepts it (WatchListCompression), ERROR events included: a watch-list
// from a version in the future gets 200 and an ERROR inside the gzip
// stream. Through the proxy the client gets the same, and the proxy sees
// the ERROR: the watch ends as an error (so it backs off), not as a
// clean close.
func TestWatchListErrorInsideGzipIsSeen(t *testing.T) {
	ns := uniqueName("gzip-error")
	sa := serviceAccount(t, ns, "agent", readWatch("configmaps"))
	p := startProxy(t, generous("everyone", 100))
	rv, _ := strconv.ParseUint(currentVersion(t, ns), 10, 64)
	q := url.Values{
		"watch": {"true"}, "sendInitialEvents": {"true"}, "resourceVersionMatch": {"NotOlderThan"},
		"allowWatchBookmarks": {"true"}, "resourceVersion": {strconv.FormatUint(rv+1_000_000, 10)},
	}
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	direct := rawWatch(t, nil, sa.Token, path, q, true, 30*time.Second)
	if direct.HTTPStatus != 200 || direct.Encoding != "gzip" || direct.FirstType != "ERROR" {
		t.Fatalf("directly: %v, Content-Encoding %q; want 200, gzip, an ERROR event (the test bed's premise)", direct, direct.Encoding)
	}
	errorsBefore := proxyMetric(t, "watchgate_proxy_watches_ended_total", map[string]string{"outcome": "error"})
	via := rawWatch(t, p, sa.Token, path, q, true, 30*time.Second)
	if via != direct {
		t.Errorf("through the proxy: %v, Content-Encoding %q; directly: %v", via, via.Encoding, direct)
	}
	eventually(t, 10*time.Second, "the watch to end as an error", func() (bool, error) {
		return proxyMetric(t, "watchgate_proxy_watches_ended_total", map[string]string{"outcome": "error"}) == errorsBefore+1, nil
	})
}

// For every combination of resourceVersion ("", "0", a valid one, one the
// proxy learned is stale), resourceVersionMatch ("", NotOlderThan, Exact)
// and sendInitialEvents (absent, true, false), and for a query the API
// server refuses, the proxy answers as the API server does: the same HTTP status and the same first event (type, and
// code of an ERROR), whether it answers locally or forwards.
func TestWatchParametersAnsweredAsTheAPIServerDoes(t *testing.T) {
	ns := uniqueName("params")
	sa := serviceAccount(t, ns, "agent", readWatch("podtemplates"))
	stale := makeStale(t, ns)
	valid := currentVersionOf(t, ns)
	if valid == stale {
		t.Fatal("no valid version besides the stale one")
	}
	p := startProxy(t, generous("everyone", 100))
	path := "/api/v1/namespaces/" + ns + "/podtemplates"

	// The proxy learns the stale version from a plain watch.
	if got := rawWatch(t, p, sa.Token, path, url.Values{"watch": {"true"}, "resourceVersion": {stale}}, false, 10*time.Second); got.Code != 410 {
		t.Fatalf("a plain watch from the stale version through the proxy: %v, want an ERROR 410", got)
	}

	type combo struct {
		rv, match, initial string
		badSelector        bool // a labelSelector that does not parse: 400
	}
	var combos []combo
	for _, rv := range []string{"", "0", valid, stale} {
		for _, match := range []string{"", "NotOlderThan", "Exact"} {
			for _, initial := range []string{"", "true", "false"} {
				combos = append(combos, combo{rv, match, initial, false})
			}
		}
	}
	combos = append(combos, combo{stale, "", "", true}, combo{valid, "", "", true})
	name := func(c combo) string {
		rv := map[string]string{"": `""`, "0": `"0"`, valid: "valid", stale: "stale"}[c.rv]
		return fmt.Sprintf("rv=%s match=%q sendInitialEvents=%q badSelector=%v", rv, c.match, c.initial, c.badSelector)
	}
	type result struct{ direct, via watchAnswer }
	results := make([]result, len(combos))
	var wg sync.WaitGroup
	for i, c := range combos {
		q := url.Values{"watch": {"true"}, "timeoutSeconds": {"2"}}
		if c.rv != "" {
			q.Set("resourceVersion", c.rv)
		}
		if c.match != "" {
			q.Set("resourceVersionMatch", c.match)
		}
		if c.initial != "" {
			q.Set("sendInitialEvents", c.initial)
		}
		if c.badSelector {
			q.Set("labelSelector", "!!")
		}
		wg.Go(func() {
			results[i].direct = rawWatch(t, nil, sa.Token, path, q, true, 5*time.Second)
			results[i].via = rawWatch(t, p, sa.Token, path, q, true, 5*time.Second)
		})
	}
	wg.Wait()
	for i, c := range combos {
		r := results[i]
		t.Logf("%s: directly %v", name(c), r.direct)
		if r.direct != r.via {
			t.Errorf("%s: directly %v, through the proxy %v", name(c), r.direct, r.via)
		}
	}
}

// currentVersionOf is the API server's current resourceVersion for
// podtemplates in ns.
func currentVersionOf(t *testing.T, ns string) string {
	t.Helper()
	l, err := env.Clientset.CoreV1().PodTemplates(ns).List(context.Background(), metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	return l.ResourceVersion
}
