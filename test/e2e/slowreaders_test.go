package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/watchgate/watchgate/proxy"
)

const (
	// unreadStreams is how many watches or lists the tenant leaves unread:
	// the hostile finding's 260 scaled down, each still holding a whole
	// event of largeConfigMapBytes.
	unreadStreams = 40
	// largeConfigMapBytes is the size of the tenant's ConfigMap's data.
	largeConfigMapBytes = 900 << 10
	// slowReadersHeadroom is how far above the memory in use at the start
	// the test puts the replica's memory high-water mark: the unread
	// streams pass it when each holds what the API server sent (about
	// 1 MiB), not when each holds a small window.
	slowReadersHeadroom = 16 << 20
	// maxUnreadLists is the replica's --max-lists-per-identity.
	maxUnreadLists = 10
	// slowReadersStallTimeout is the replica's --stalled-stream-timeout.
	slowReadersStallTimeout = 3 * time.Second
)

// A tenant's watches of a large ConfigMap in its own namespace whose
// client never reads (HTTP/2 connections that give no flow-control credit
// back) hold
// little in the replica, are accounted to the tenant, and are cut once
// their writes have stalled for --stalled-stream-timeout; meanwhile
// another tenant's watch is admitted. The replica's memory is the Go
// runtime's own (RuntimeMemory), against a limit set so that the
// high-water mark is 16 MiB above what the process used at the start.
func TestUnreadWatchesDoNotRefuseAnotherTenant(t *testing.T) {
	testUnreadStreams(t, "watch", "?watch=true&allowWatchBookmarks=false")
}

// The same with lists: a tenant's unread lists of its namespace's large
// ConfigMap; beyond --max-lists-per-identity (10 here) its lists get 429
// MaxListsPerIdentity, while another tenant's list and watch are served.
func TestUnreadListsDoNotRefuseAnotherTenant(t *testing.T) {
	testUnreadStreams(t, "list", "")
}

func testUnreadStreams(t *testing.T, kind, query string) {
	ctx := context.Background()
	tenantNS, otherNS := uniqueName("slow-"+kind), uniqueName("other-"+kind)
	tenant := serviceAccount(t, tenantNS, "tenant", readWatch("configmaps"))
	other := serviceAccount(t, otherNS, "other", readWatch("configmaps"))
	big := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "large"}, Data: map[string]string{"blob": strings.Repeat("x", largeConfigMapBytes)}}
	if _, err := env.Clientset.CoreV1().ConfigMaps(tenantNS).Create(ctx, big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	runtime.GC()
	base, _ := proxy.RuntimeMemory()
	limit := uint64(float64(base+slowReadersHeadroom) / 0.85)
	p := startProxyWith(t, func(o *proxy.Options) {
		o.MemoryHighWaterPercent = 85
		o.MemoryReader = func() (uint64, uint64) {
			inUse, _ := proxy.RuntimeMemory()
			return inUse, limit
		}
		o.StalledStreamTimeout = slowReadersStallTimeout
		o.MaxListsPerIdentity = maxUnreadLists
	}, generous("everyone", 100))
	cutBefore := proxyMetric(t, "watchgate_proxy_stalled_streams_cut_total", map[string]string{"kind": kind})

	path := "/api/v1/namespaces/" + tenantNS + "/configmaps" + query
	streams := make([]*unreadStream, 0, unreadStreams)
	defer func() {
		for _, u := range streams {
			_ = u.conn.Close()
		}
	}()
	for range unreadStreams {
		streams = append(streams, openUnreadStream(t, p, tenant.Token, path))
	}
	// Let the API server's answers reach the replica and stall there: the
	// streams are cut only after slowReadersStallTimeout.
	time.Sleep(slowReadersStallTimeout / 2)
	runtime.GC()

	hc := plainClient(t, p, other.Token)
	code, decision := status(t, hc, p.URL+"/api/v1/namespaces/"+otherNS+"/configmaps?watch=true&timeoutSeconds=2")
	if code != http.StatusOK {
		inUse, _ := proxy.RuntimeMemory()
		t.Errorf("another tenant's watch beside %d unread %ss: HTTP %d (%s), want 200 (memory in use %d MiB, mark %d MiB)",
			unreadStreams, kind, code, decision, inUse>>20, uint64(0.85*float64(limit))>>20)
	}
	if kind == "list" {
		if code, _ := status(t, hc, p.URL+"/api/v1/namespaces/"+otherNS+"/configmaps"); code != http.StatusOK {
			t.Errorf("another tenant's list: HTTP %d, want 200", code)
		}
	}

	// Each unread stream is cut, or was refused for the bytes the tenant's
	// streams hold; the cuts are counted.
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, overLists := 0, 0
	for i, u := range streams {
		wg.Go(func() {
			refused, err := u.end(10 * slowReadersStallTimeout)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("unread %s %d: %v", kind, i, err)
			case refused == "":
				admitted++
			case kind == "list" && strings.HasPrefix(refused, "429 ") && strings.Contains(refused, "reason="+proxy.GuardMaxListsPerIdentity):
				overLists++
			case !strings.HasPrefix(refused, "429 ") || !strings.Contains(refused, "reason="+proxy.GuardBufferedBytes):
				t.Errorf("unread %s %d: refused with %s, want 429 %s", kind, i, refused, proxy.GuardBufferedBytes)
			}
		})
	}
	wg.Wait()
	if admitted == 0 {
		t.Errorf("none of the tenant's %d unread %ss was admitted", unreadStreams, kind)
	}
	if kind == "list" && (admitted > maxUnreadLists || overLists == 0) {
		t.Errorf("%d of the tenant's unread lists admitted, %d refused %s; want at most %d admitted and the others refused",
			admitted, overLists, proxy.GuardMaxListsPerIdentity, maxUnreadLists)
	}
	if cut := proxyMetric(t, "watchgate_proxy_stalled_streams_cut_total", map[string]string{"kind": kind}) - cutBefore; cut < float64(admitted) {
		t.Errorf("%v of the %d unread %ss admitted counted as cut", cut, admitted, kind)
	}
	t.Logf("%d unread %ss admitted and cut, %d refused for the tenant's lists in flight, %d for its buffered bytes",
		admitted, kind, overLists, unreadStreams-admitted-overLists)
}

// unreadStream is a GET of path to the proxy p with token, on an HTTP/2
// connection of its own whose client never gives flow-control credit
// back: the proxy may send it HTTP/2's initial 64 KiB and no more, as to
// a client that does not read its stream.
type unreadStream struct {
	conn net.Conn
	fr   *http2.Framer
}

func openUnreadStream(t *testing.T, p *testProxy, token, path string) *unreadStream {
	t.Helper()
	addr := strings.TrimPrefix(p.URL, "https://")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.CA)
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", addr}, {":path", path},
		{"authorization", "Bearer " + token}, {"accept", "application/json"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	_, err = conn.Write([]byte(http2.ClientPreface))
	if err == nil {
		err = fr.WriteSettings()
	}
	if err == nil {
		err = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true})
	}
	if err != nil {
		_ = conn.Close()
		t.Fatal(err)
	}
	return &unreadStream{conn: conn, fr: fr}
}

// end reads the connection's frames until the stream or the connection
// ends. A stream the proxy refused (its answer's status and decision
// header) is returned as refused; one it answered 200 must be cut (reset,
// or its connection closed) within timeout, before the whole ConfigMap
// came.
func (u *unreadStream) end(timeout time.Duration) (refused string, err error) {
	_ = u.conn.SetReadDeadline(time.Now().Add(timeout))
	u.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	n := 0
	for {
		f, rerr := u.fr.ReadFrame()
		var ne net.Error
		if errors.As(rerr, &ne) && ne.Timeout() {
			return "", fmt.Errorf("still open after %v (%d bytes of DATA)", timeout, n)
		}
		if rerr != nil {
			return "", nil //nolint:nilerr // the connection ended: the proxy cut it
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if code := f.PseudoValue("status"); code != "200" {
				for _, hf := range f.RegularFields() {
					if strings.EqualFold(hf.Name, proxy.DecisionHeader) {
						return code + " " + hf.Value, nil
					}
				}
				return "", fmt.Errorf("HTTP %s without a decision", code)
			}
		case *http2.DataFrame:
			n += len(f.Data())
			if f.StreamEnded() || n >= largeConfigMapBytes {
				return "", fmt.Errorf("%d bytes of DATA, end of stream %v: want it cut before the whole ConfigMap", n, f.StreamEnded())
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			return "", nil
		}
	}
}

// plainClient is an HTTP client to the proxy p with token that does not
// retry a 429 or 503 as client-go would.
func plainClient(t *testing.T, p *testProxy, token string) *http.Client {
	t.Helper()
	hc, err := rest.HTTPClientFor(p.Config(token, false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// status GETs url and returns the status code and X-Watchgate-Decision,
// reading the body to its end (a watch with timeoutSeconds ends).
func status(t *testing.T, hc *http.Client, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(proxy.DecisionHeader)
}
