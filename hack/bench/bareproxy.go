package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	_ "net/http/pprof" // the harness profiles the floor too (--pprof)
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/util/cert"
)

// bareProxyCommand is the name of the subcommand that runs the floor.
const bareProxyCommand = "bare-proxy"

// runBareProxy is the floor every proxy in front of kube-apiserver pays: a
// plain httputil.ReverseProxy, TLS on both sides (a self-signed serving
// certificate; the API server verified with its CA), HTTP/2 on both hops,
// responses flushed as they come (watch streams), the client's headers —
// its bearer token among them — forwarded as they are. Nothing else: no
// authentication, no classification, no stream inspection. It runs as its
// own process (the harness re-executes itself) so that its CPU and memory
// can be read from /proc like watchgate's.
func runBareProxy(args []string) error {
	fs := flag.NewFlagSet(bareProxyCommand, flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	upstream := fs.String("upstream", "", "the API server's URL")
	caFile := fs.String("ca-file", "", "the API server's CA (PEM)")
	pprofAddr := fs.String("pprof", "", "address to serve Go's /debug/pprof/ on (plain HTTP, for the harness's profiles); empty: none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	target, err := url.Parse(*upstream)
	if err != nil || target.Host == "" {
		return fmt.Errorf("--upstream %q: not a URL", *upstream)
	}
	caPEM, err := os.ReadFile(*caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("--ca-file %s: no certificate", *caFile)
	}
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("localhost", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		return err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 100,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		FlushInterval: -1,
		ErrorLog:      log.New(os.Stderr, "bare-proxy: ", log.LstdFlags),
	}
	srv := &http.Server{
		Addr:              *listen,
		Handler:           rp,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *pprofAddr != "" {
		// http.DefaultServeMux holds net/http/pprof's handlers.
		ps := &http.Server{Addr: *pprofAddr, Handler: http.DefaultServeMux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = ps.ListenAndServe() }()
		defer ps.Close()
	}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
		_ = srv.Close()
	}()
	if err := srv.ListenAndServeTLS("", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
