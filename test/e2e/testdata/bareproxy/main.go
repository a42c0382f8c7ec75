// Command bareproxy is the floor the load test (load_test.go) compares
// watchgate with: httputil.ReverseProxy{Rewrite} in front of the API
// server, HTTP/2 both ways, flushed per write, nothing else — no
// authentication, no budgets, no stream inspection. It lives under testdata
// so that `go build ./...` and `make test` leave it out.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "HTTPS address to serve on")
	stats := flag.String("stats", "127.0.0.1:0", "plain HTTP address serving its goroutines, Go heap in use and goroutine stacks in use (bytes), one a line; after a garbage collection with ?gc=1")
	upstream := flag.String("upstream", "", "API server URL")
	caFile := flag.String("ca-file", "", "API server CA (PEM)")
	flag.Parse()
	target, err := url.Parse(*upstream)
	if err != nil {
		log.Fatal(err)
	}
	ca, err := os.ReadFile(*caFile)
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		FlushInterval: -1,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool},
			ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 100, DisableCompression: true,
		},
	}
	go func() {
		ln, err := net.Listen("tcp", *stats)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("stats", ln.Addr())
		log.Fatal(http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("gc") == "1" {
				runtime.GC()
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			fmt.Fprintf(w, "%d\n%d\n%d\n", runtime.NumGoroutine(), m.HeapInuse, m.StackInuse)
		})))
	}()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{Certificates: []tls.Certificate{selfSigned()}},
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 1000}}
	fmt.Println("serving", ln.Addr())
	log.Fatal(srv.ServeTLS(ln, "", ""))
}

func selfSigned() tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bareproxy"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		log.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
