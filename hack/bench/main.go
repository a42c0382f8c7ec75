// Command bench is `make bench`: it starts the test bed's kube-apiserver
// (with its watch cache, as in production) and measures, in one run, three
// ways to it — direct; through a bare httputil.ReverseProxy, the floor any
// proxy pays; and through watchgate (bin/watchgate) with a WatchBudget that
// decides every watch and list and rejects none — with the paths
// interleaved in rounds so that machine load hits all three alike. It
// writes a markdown table with ratios to the bare proxy into BENCHMARKS.md
// between marker comments and prints it. It is bounded by --timeout and
// stops by itself.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/watchgate/watchgate/test/apiserver"
)

// config is what a run measures; every count is bounded in main.
type config struct {
	watchgate  string
	benchmarks string
	rounds     int
	gets       int
	opens      int
	replays    int
	objects    int
	idle       int
	timeout    time.Duration
	write      bool
	// cpuProfile, when set, receives a CPU profile of watchgate (and
	// cpuProfile.bare one of the bare proxy) taken through their pprof
	// servers over the first profileFor of the rounds.
	cpuProfile string
	profileFor time.Duration
	// memProfiles, when set, is a folder that receives each proxy's heap
	// profile (and its MemStats, as text) before and with the idle
	// watches open.
	memProfiles string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == bareProxyCommand {
		if err := runBareProxy(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bare-proxy:", err)
			os.Exit(1)
		}
		return
	}
	root := apiserver.RepoRoot()
	var c config
	flag.StringVar(&c.watchgate, "watchgate", filepath.Join(root, "bin", "watchgate"), "the watchgate binary (make build)")
	flag.StringVar(&c.benchmarks, "benchmarks", filepath.Join(root, "BENCHMARKS.md"), "file whose marked block receives the table")
	flag.BoolVar(&c.write, "write", true, "write the table into --benchmarks")
	flag.IntVar(&c.rounds, "rounds", 21, "rounds; in each, every phase (GETs, watch opens, replays) visits the three paths in a rotated order before the next phase (1-100; a multiple of 3 gives each path each place equally often)")
	flag.IntVar(&c.gets, "gets", 300, "GETs per path per round (1-10000)")
	flag.IntVar(&c.opens, "opens", 300, "watch opens per path per round (1-10000)")
	flag.IntVar(&c.replays, "replays", 4, "replays per encoding per path per round (1-100)")
	flag.IntVar(&c.objects, "objects", 3000, "config maps a replay streams (1-20000)")
	flag.IntVar(&c.idle, "idle-watches", 2000, "idle watches held open per proxy for the memory figure (1-10000)")
	flag.DurationVar(&c.timeout, "timeout", 12*time.Minute, "the whole run gives up after this (1m-1h)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write CPU profiles of watchgate and the bare proxy over the same span of the rounds to this file and FILE.bare (go tool pprof -top FILE); profiling costs the proxies CPU, so pair it with -write=false")
	flag.StringVar(&c.memProfiles, "memprofiles", "", "write each proxy's heap profile before and with the idle watches open into this folder ({bare-proxy,watchgate}-{before,idle}.pb.gz, and .txt with MemStats)")
	flag.DurationVar(&c.profileFor, "profile-for", 30*time.Second, "how long -cpuprofile profiles, from the first round (1s-10m)")
	flag.Parse()
	if c.rounds < 1 || c.rounds > 100 || c.gets < 1 || c.gets > 10000 || c.opens < 1 || c.opens > 10000 ||
		c.replays < 1 || c.replays > 100 || c.objects < 1 || c.objects > 20000 || c.idle < 1 || c.idle > 10000 ||
		c.timeout < time.Minute || c.timeout > time.Hour || c.profileFor < time.Second || c.profileFor > 10*time.Minute {
		fmt.Fprintln(os.Stderr, "bench: a count, --timeout or --profile-for is out of bounds (see -h)")
		os.Exit(2)
	}
	if err := outputsWritable(c); err != nil {
		// Found out now, not after minutes of rounds.
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelRun := context.WithTimeout(ctx, c.timeout)
	defer cancelRun()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// outputsWritable creates the profile files and folder the flags name
// (empty until the run writes them), so a typo in a path fails at once.
func outputsWritable(c config) error {
	if c.cpuProfile != "" {
		for _, f := range []string{c.cpuProfile, c.cpuProfile + ".bare"} {
			if err := os.WriteFile(f, nil, 0o644); err != nil {
				return fmt.Errorf("-cpuprofile: %w", err)
			}
		}
	}
	if c.memProfiles != "" {
		if err := os.MkdirAll(c.memProfiles, 0o755); err != nil {
			return fmt.Errorf("-memprofiles: %w", err)
		}
	}
	return nil
}

func step(format string, args ...any) {
	fmt.Printf("==> %s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
}

// tokenTransport adds a bearer token, as client-go does, on a transport the
// harness owns (client-go's transports are cached and shared by TLS
// configuration; the idle watches need one of their own).
type tokenTransport struct {
	token string
	next  http.RoundTripper
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.next.RoundTrip(r)
}

// CloseIdleConnections closes the wrapped transport's idle connections.
func (t tokenTransport) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// newTransport is an HTTP/2 client transport that trusts pool, or any
// certificate when pool is nil (the proxies' self-signed ones).
func newTransport(token string, pool *x509.CertPool) http.RoundTripper {
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if pool == nil {
		tc.InsecureSkipVerify = true // loopback, self-signed, measured not trusted
	}
	return tokenTransport{token: token, next: &http.Transport{
		TLSClientConfig:     tc,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 100,
		IdleConnTimeout:     90 * time.Second,
	}}
}
