// Command attacker is the hostile tenant of the hostile-tenant load test
// (hostile_test.go), in a process of its own so that its CPU can be told
// apart from the replica's and the API server's: with -cpu it runs pinned
// to that CPU and with -nice at that niceness, as a client on another
// machine would take nothing from the machine under test. It runs every
// loop named in -loops for -for, each bounded in count, and prints one JSON
// object: the answers of each loop by status and reason, and how long each
// loop ran. It lives under testdata so that `go build ./...` and `make
// test` leave it out.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/watchgate/watchgate/inject"
	"github.com/watchgate/watchgate/proxy"
)

// pinnedEnv marks the process that already runs on its CPU.
const pinnedEnv = "ATTACKER_PINNED"

func main() {
	proxyURL := flag.String("proxy", "", "watchgate's proxy URL (https://host:port)")
	webhook := flag.String("webhook", "", "watchgate's webhook address (host:port)")
	ns := flag.String("namespace", "", "the attacker's namespace")
	token := flag.String("token", "", "the attacker's bearer token")
	revoked := flag.String("revoked-token", "", "a token of the attacker bound to a deleted pod")
	stale := flag.String("stale", "", "a compacted resourceVersion")
	attackFor := flag.Duration("for", time.Minute, "how long the attack lasts")
	loops := flag.String("loops", "", "comma-separated loops to run (own, users, stale, tokens, revoked, webhook); empty runs every loop")
	cpu := flag.Int("cpu", -1, "run pinned to this CPU (-1: anywhere)")
	nice := flag.Int("nice", 0, "run at this niceness")
	flag.Parse()
	if (*cpu >= 0 || *nice != 0) && os.Getenv(pinnedEnv) == "" {
		pin(*cpu, *nice)
	}

	ctx, cancel := context.WithTimeout(context.Background(), *attackFor)
	defer cancel()
	var tally tallies
	var attack sync.WaitGroup
	start := time.Now()
	var tookMu sync.Mutex
	took := map[string]string{}
	with := func(name string, loop func()) {
		if *loops == "" || slices.Contains(strings.Split(*loops, ","), name) {
			attack.Go(func() {
				loop()
				tookMu.Lock()
				defer tookMu.Unlock()
				took[name] = time.Since(start).Round(100 * time.Millisecond).String()
			})
		}
	}
	watchPath := *proxyURL + "/api/v1/namespaces/" + *ns + "/configmaps?watch=true&timeoutSeconds=300"
	listPath := *proxyURL + "/api/v1/namespaces/" + *ns + "/configmaps"
	// Watches in its own name and as made-up users, held until the attack
	// ends: over HTTP/2, a few hundred streams a connection.
	own, users := newClients(8, "127.0.0.1"), newClients(8, "127.0.0.1")
	with("own", func() {
		holdWatches(ctx, &tally, "own watches", own, watchPath, *token, 3000, func(int) []string { return nil })
	})
	with("users", func() {
		holdWatches(ctx, &tally, "watches as made-up users", users, watchPath, *token, 5000, func(i int) []string {
			return []string{"Impersonate-User", fmt.Sprintf("made-up-%d", i)}
		})
	})
	// The stale storm: concurrent watches from one compacted version.
	storm := newClients(4, "127.0.0.1")
	with("stale", func() {
		path := *proxyURL + "/api/v1/namespaces/" + *ns + "/configmaps?watch=true&timeoutSeconds=5&resourceVersion=" + *stale
		pace := spread(20000, *attackFor, 64)
		requests(ctx, &tally, "stale-version watches", storm, 64, 20000, func(int) (string, string, []string) {
			_ = pace.Wait(ctx)
			return path, *token, nil
		})
	})
	// Random tokens from eight addresses of one /24.
	var flood []*http.Client
	for i := 2; i < 10; i++ {
		flood = append(flood, newClients(1, fmt.Sprintf("127.0.0.%d", i))...)
	}
	with("tokens", func() {
		pace := spread(50000, *attackFor, 32)
		requests(ctx, &tally, "random tokens", flood, 32, 50000, func(int) (string, string, []string) {
			_ = pace.Wait(ctx)
			return listPath, randomString(32), nil
		})
	})
	// The token of the deleted pod, ten times a second.
	revokedClients := newClients(1, "127.0.0.1")
	with("revoked", func() {
		for i := 0; i < int(*attackFor/(100*time.Millisecond)) && ctx.Err() == nil; i++ {
			requests(ctx, &tally, "deleted pod's token", revokedClients, 1, 1, func(int) (string, string, []string) { return listPath, *revoked, nil })
			time.Sleep(100 * time.Millisecond)
		}
	})
	// Admission reviews at the webhook port: pods of 2.9 MiB (under its
	// body limit) and bodies of 6 MiB (over it).
	webhookClients := newClients(2, "127.0.0.1")
	for _, size := range []int{29 << 20 / 10, 6 << 20} {
		body := admissionReview(*ns, size)
		with("webhook", func() {
			requestsWith(ctx, &tally, fmt.Sprintf("admission reviews of %.1f MiB", float64(size)/(1<<20)), webhookClients, 4, 2000, func(int) *http.Request {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+*webhook+inject.WebhookPath, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				return req
			})
		})
	}
	attack.Wait()
	for _, c := range slices.Concat(own, users, storm, flood, revokedClients, webhookClients) {
		c.CloseIdleConnections()
	}
	out, _ := json.Marshal(struct {
		Answers map[string]map[string]int `json:"answers"`
		Took    map[string]string         `json:"took"`
	}{tally.m, took})
	fmt.Println(string(out))
}

// pin runs this program anew on cpu (if not negative) at niceness nice:
// the calling thread's affinity and niceness are what exec keeps, and every
// thread of the new process inherits them.
func pin(cpu, nice int) {
	runtime.LockOSThread()
	if cpu >= 0 {
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			log.Fatalf("pin to CPU %d: %v", cpu, err)
		}
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, 0, nice); err != nil {
		log.Fatalf("niceness %d: %v", nice, err)
	}
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(syscall.Exec(self, os.Args, append(os.Environ(), pinnedEnv+"=1")))
}

// tallies counts the answers of each loop by status and reason.
type tallies struct {
	mu sync.Mutex
	m  map[string]map[string]int
}

func (t *tallies) add(loop string, resp *http.Response, err error) {
	key := "error"
	if err == nil {
		key = strconv.Itoa(resp.StatusCode)
		if d := resp.Header.Get(proxy.DecisionHeader); d != "" && resp.StatusCode != http.StatusOK {
			if _, r, ok := strings.Cut(d, "reason="); ok {
				r, _, _ = strings.Cut(r, ";")
				key += " " + r
			}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]map[string]int{}
	}
	if t.m[loop] == nil {
		t.m[loop] = map[string]int{}
	}
	t.m[loop][key]++
}

// newClients returns n HTTP/2 clients whose connections come from the
// loopback address ip.
func newClients(n int, ip string) []*http.Client {
	out := make([]*http.Client, n)
	for i := range out {
		out[i] = &http.Client{Transport: &http.Transport{
			DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext,
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // loopback, a throwaway certificate
			ForceAttemptHTTP2: true,
		}}
	}
	return out
}

// holdWatches opens up to n watches of url with token, 32 at a time, each
// with the headers of its index, and holds the admitted ones until ctx
// ends; it returns when every watch it opened has ended.
func holdWatches(ctx context.Context, tally *tallies, loop string, clients []*http.Client, url, token string, n int, headers func(int) []string) {
	var held sync.WaitGroup
	defer held.Wait()
	var next atomic.Int64
	var openers sync.WaitGroup
	for range 32 {
		openers.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				h := headers(i)
				for j := 0; j+1 < len(h); j += 2 {
					req.Header.Set(h[j], h[j+1])
				}
				resp, err := clients[i%len(clients)].Do(req)
				if ctx.Err() != nil {
					if err == nil {
						resp.Body.Close()
					}
					return
				}
				tally.add(loop, resp, err)
				if err != nil {
					continue
				}
				if resp.StatusCode != http.StatusOK {
					_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
					resp.Body.Close()
					continue
				}
				held.Go(func() {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				})
			}
		})
	}
	openers.Wait()
}

// requests sends up to n GET requests, concurrency at a time, each with
// the url, token and headers of its index, reading every answer whole;
// it stops when ctx ends.
func requests(ctx context.Context, tally *tallies, loop string, clients []*http.Client, concurrency, n int, of func(int) (string, string, []string)) {
	requestsWith(ctx, tally, loop, clients, concurrency, n, func(i int) *http.Request {
		url, token, h := of(i)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		for j := 0; j+1 < len(h); j += 2 {
			req.Header.Set(h[j], h[j+1])
		}
		return req
	})
}

// requestsWith sends up to n requests, concurrency at a time, the request
// of each index, reading every answer whole; it stops when ctx ends.
func requestsWith(ctx context.Context, tally *tallies, loop string, clients []*http.Client, concurrency, n int, of func(int) *http.Request) {
	var next atomic.Int64
	var senders sync.WaitGroup
	for range concurrency {
		senders.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				resp, err := clients[i%len(clients)].Do(of(i))
				if ctx.Err() != nil {
					if err == nil {
						resp.Body.Close()
					}
					return
				}
				tally.add(loop, resp, err)
				if err == nil {
					_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
					resp.Body.Close()
				}
			}
		})
	}
	senders.Wait()
}

// admissionReview is a pod's AdmissionReview of about size bytes, the
// pod's bulk in one annotation.
func admissionReview(ns string, size int) []byte {
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: ns, Annotations: map[string]string{"bulk": strings.Repeat("x", size)}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "c"}}},
	}
	raw, _ := json.Marshal(pod)
	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: ns, Operation: admissionv1.Create, Object: kruntime.RawExtension{Raw: raw},
		},
	})
	return body
}

// spread paces n requests evenly over d, burst at a time, so that a flood
// lasts the whole attack rather than its first seconds.
func spread(n int, d time.Duration, burst int) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(float64(n)/d.Seconds()), burst)
}

// randomString is n random bytes, URL-safe base64.
func randomString(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
