// Command loadclient is one process of the load test's client
// (load_test.go): it holds idle watches through a proxy over a fixed number
// of HTTP/2 connections, and measures how late the events written into the
// watched ConfigMaps arrive. Several of them hold more watches than one
// process should. It lives under testdata so that `go build ./...` and
// `make test` leave it out.
//
// Watch k (k counts from --first) selects ConfigMap g<g> by name
// (fieldSelector metadata.name), g = k mod --groups, in namespace
// <--namespace-prefix><g mod --namespaces>, from resourceVersion 0: the
// API server's watch cache files a watch selecting one name under that
// name, so a write is handed to its own watches only, not filtered by
// every watch in its namespace (which at 50,000 watches took more of a
// 2-core machine's CPU than the proxies measured). A MODIFIED event whose object
// carries data.loadts (the writer's wall clock, Unix nanoseconds) is one
// latency sample: receive time − loadts.
//
// It reads commands from stdin, one a line, and answers each with one line
// on stdout:
//
//	open K   opens K watches all at once (at most --in-flight requests at a
//	         time), each asked for again as an informer's reflector and
//	         its rest client do (see maxRetries), for at most --open-for;
//	         answers "opened <ok> <nanoseconds> <retries> <reason>=<n> ...",
//	         the final refusals by X-Watchgate-Decision reason or HTTP
//	         status
//	close K  ends the K oldest watches; answers "closed <K> <held>"
//	lat      answers "lat <events> <errors> <µs> <µs> ...": the latency
//	         samples since the last lat, and forgets them
//	held     answers "held <watches open> <ended by the server>"
//
// It exits when stdin closes, on "quit", or after --lifetime, whichever is
// first; every request is to the --url given, on loopback.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// decisionHeader is proxy.DecisionHeader (this command imports nothing of
// the module, so that it builds alone).
const decisionHeader = "X-Watchgate-Decision"

type client struct {
	url, token, prefix          string
	groups, namespaces          int
	inFlight                    int
	conns                       []*http.Client
	nextConn, next              atomic.Int64
	events, errors, serverEnded atomic.Int64
	told                        sync.Map // refusal reasons logged
	retried                     atomic.Int64
	openFor                     time.Duration

	mu   sync.Mutex
	open []*watch // oldest first
	lat  []int64  // µs
	wg   sync.WaitGroup
}

// watch is one open watch; closed is set before the client ends it, so
// that an end the client did not ask for is counted.
type watch struct {
	cancel context.CancelFunc
	closed atomic.Bool
}

func main() {
	c := &client{}
	flag.StringVar(&c.url, "url", "", "proxy URL (https://127.0.0.1:port)")
	tokenFile := flag.String("token-file", "", "file holding the bearer token")
	flag.StringVar(&c.prefix, "namespace-prefix", "load-", "namespaces are this prefix and a number")
	flag.IntVar(&c.namespaces, "namespaces", 1, "namespaces the groups are spread over")
	flag.IntVar(&c.groups, "groups", 1, "label groups the watches are spread over")
	first := flag.Int64("first", 0, "index of this process's first watch")
	connections := flag.Int("connections", 10, "HTTP/2 connections the watches are spread over")
	flag.IntVar(&c.inFlight, "in-flight", 500, "watch requests awaiting their answer at once")
	lifetime := flag.Duration("lifetime", time.Hour, "exit after this long whatever happens")
	flag.DurationVar(&c.openFor, "open-for", 10*time.Minute, "an open command asks for a watch again, after answers that invite it, for at most this long")
	flag.Parse()
	tok, err := os.ReadFile(*tokenFile)
	if err != nil {
		log.Fatal(err)
	}
	c.token = strings.TrimSpace(string(tok))
	c.next.Store(*first)
	raiseFileLimit()
	for range *connections {
		// One transport is one connection: each has its own pool, and
		// holds fewer streams than the proxies' limit (1,000).
		c.conns = append(c.conns, &http.Client{Transport: &http.Transport{
			TLSClientConfig:       &tls.Config{InsecureSkipVerify: true}, // loopback, a throwaway certificate
			ForceAttemptHTTP2:     true,
			ResponseHeaderTimeout: 5 * time.Minute, // a watch not answered by then counts as an error
		}})
	}
	go func() {
		time.Sleep(*lifetime)
		log.Printf("lifetime %v over", *lifetime)
		os.Exit(2)
	}()
	out := bufio.NewWriter(os.Stdout)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		k := 0
		if len(f) > 1 {
			k, _ = strconv.Atoi(f[1])
		}
		switch f[0] {
		case "open":
			fmt.Fprintln(out, c.openWatches(k))
		case "close":
			fmt.Fprintf(out, "closed %d %d\n", c.closeOldest(k), c.held())
		case "lat":
			fmt.Fprintln(out, c.takeLatencies())
		case "held":
			fmt.Fprintf(out, "held %d %d\n", c.held(), c.serverEnded.Load())
		case "quit":
			c.closeOldest(c.held())
			_ = out.Flush()
			return
		default:
			fmt.Fprintf(out, "unknown %q\n", f[0])
		}
		_ = out.Flush()
	}
	c.closeOldest(c.held())
}

// raiseFileLimit lifts the soft limit on open files to the hard one (Go
// does at start-up; this says so when it cannot).
func raiseFileLimit() {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		log.Printf("RLIMIT_NOFILE: %v", err)
	}
}

// tell logs the first refusal of each reason to stderr.
func (c *client) tell(reason, what string) {
	if _, told := c.told.LoadOrStore(reason, true); !told {
		log.Printf("refused (%s): %s", reason, what)
	}
}

func (c *client) held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.open)
}

// openWatches opens k watches, all at once but for the in-flight bound, and
// says how many it opened, how long that took and why the others were
// refused.
func (c *client) openWatches(k int) string {
	start := time.Now()
	var ok atomic.Int64
	var rmu sync.Mutex
	refused := map[string]int{}
	sem := make(chan struct{}, c.inFlight)
	var wg sync.WaitGroup
	for range k {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if reason := c.openOne(start.Add(c.openFor)); reason != "" {
				rmu.Lock()
				refused[reason]++
				rmu.Unlock()
				return
			}
			ok.Add(1)
		})
	}
	wg.Wait()
	var b strings.Builder
	fmt.Fprintf(&b, "opened %d %d %d", ok.Load(), time.Since(start).Nanoseconds(), c.retried.Swap(0))
	reasons := make([]string, 0, len(refused))
	for r := range refused {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Fprintf(&b, " %s=%d", r, refused[r])
	}
	return b.String()
}

// maxRetries is how often a watch is asked for again, as client-go's rest
// client does by default (10): after a 429 or a 5xx with a Retry-After,
// that many seconds later (watchgate's own refusals included: client-go
// does not tell them apart), and after a transport error, a second later.
// Past them, or at once after a 5xx without a Retry-After (a proxy's
// transport error, such as the bare proxy's 502), the request fails and an
// informer's reflector asks again after its backoff (reflectorBackoff,
// doubling up to reflectorMaxBackoff, jittered), with as many retries
// again.
const (
	maxRetries          = 10
	reflectorBackoff    = 800 * time.Millisecond
	reflectorMaxBackoff = 30 * time.Second
)

// openOne opens the next watch, asking again until deadline as a
// reflector would; it answers why it was refused, or "" once its response
// headers arrived with 200.
func (c *client) openOne(deadline time.Time) string {
	k := c.next.Add(1) - 1
	g := k % int64(c.groups)
	path := fmt.Sprintf("%s/api/v1/namespaces/%s%d/configmaps?watch=true&resourceVersion=0&timeoutSeconds=3600&fieldSelector=%s",
		c.url, c.prefix, g%int64(c.namespaces), url.QueryEscape("metadata.name=g"+strconv.FormatInt(g, 10)))
	backoff := reflectorBackoff
	for {
		var reason string
		for attempt := 0; ; attempt++ {
			var retryAfter time.Duration
			reason, retryAfter = c.try(path)
			if retryAfter == 0 {
				return reason
			}
			if retryAfter == failed || attempt == maxRetries || time.Now().Add(retryAfter).After(deadline) {
				break
			}
			c.retried.Add(1)
			time.Sleep(retryAfter)
		}
		// Jittered as wait.Jitter(backoff, 1.0): up to twice as long.
		wait := backoff + rand.N(backoff)
		if time.Now().Add(wait).After(deadline) {
			return reason
		}
		c.retried.Add(1)
		time.Sleep(wait)
		backoff = min(2*backoff, reflectorMaxBackoff)
	}
}

// failed is try's wait for a 5xx without a Retry-After: the rest client
// does not ask again, the reflector does.
const failed = -1

// try asks for one watch once; it answers why it was refused ("" when
// open) and, when the answer was no decision, how long to wait before
// asking again, or failed.
func (c *client) try(path string) (string, time.Duration) {
	conn := c.conns[int(c.nextConn.Add(1)-1)%len(c.conns)]
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, path, nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := conn.Do(req)
	if err != nil {
		cancel()
		c.tell("error", err.Error())
		return "error", time.Second
	}
	if resp.StatusCode != http.StatusOK {
		reason := strconv.Itoa(resp.StatusCode)
		d := resp.Header.Get(decisionHeader)
		if _, r, ok := strings.Cut(d, "reason="); ok {
			reason, _, _ = strings.Cut(r, ";")
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		cancel()
		c.tell(reason, fmt.Sprintf("%s %s: %s", resp.Status, d, body))
		if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode < 500 {
			return reason, 0
		}
		s, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		switch {
		case (err != nil || s <= 0) && resp.StatusCode >= 500:
			return reason, failed
		case err != nil || s <= 0:
			return reason, 0
		}
		return reason, time.Duration(s) * time.Second
	}
	w := &watch{cancel: cancel}
	c.mu.Lock()
	c.open = append(c.open, w)
	c.mu.Unlock()
	c.wg.Go(func() {
		defer resp.Body.Close()
		c.read(w, resp.Body)
	})
	return "", 0
}

var (
	modified = []byte(`"type":"MODIFIED"`)
	errEvent = []byte(`"type":"ERROR"`)
	stamp    = []byte(`"loadts":"`)
)

// read takes a watch's events (JSON, one a line) until the stream ends,
// and keeps a latency sample of each stamped MODIFIED event.
func (c *client) read(w *watch, body io.Reader) {
	r := bufio.NewReaderSize(body, 4096)
	for {
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// An event longer than the buffer: not one of the writer's.
			for err == bufio.ErrBufferFull {
				_, err = r.ReadSlice('\n')
			}
			continue
		}
		if err != nil {
			if !w.closed.Load() {
				c.serverEnded.Add(1)
			}
			return
		}
		now := time.Now().UnixNano()
		if bytes.Contains(line, errEvent) {
			c.errors.Add(1)
			continue
		}
		if !bytes.Contains(line, modified) {
			continue
		}
		i := bytes.Index(line, stamp)
		if i < 0 {
			continue
		}
		rest := line[i+len(stamp):]
		j := bytes.IndexByte(rest, '"')
		if j < 0 {
			continue
		}
		ts, perr := strconv.ParseInt(string(rest[:j]), 10, 64)
		if perr != nil {
			continue
		}
		c.events.Add(1)
		c.mu.Lock()
		c.lat = append(c.lat, (now-ts)/1000)
		c.mu.Unlock()
	}
}

func (c *client) takeLatencies() string {
	c.mu.Lock()
	lat := c.lat
	c.lat = nil
	c.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "lat %d %d", c.events.Swap(0), c.errors.Swap(0))
	for _, v := range lat {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(v, 10))
	}
	return b.String()
}

// closeOldest ends the k oldest watches and waits until their readers
// returned; it answers how many it ended.
func (c *client) closeOldest(k int) int {
	c.mu.Lock()
	k = min(k, len(c.open))
	for _, w := range c.open[:k] {
		w.closed.Store(true)
		w.cancel()
	}
	c.open = append(c.open[:0:0], c.open[k:]...)
	none := len(c.open) == 0
	c.mu.Unlock()
	if none {
		c.wg.Wait()
	}
	return k
}
