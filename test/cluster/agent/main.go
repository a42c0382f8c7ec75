// Command agent is an in-cluster client-go program, as an agent routed
// through watchgate runs: it builds its config with rest.InClusterConfig
// (the routed pod's KUBERNETES_SERVICE_HOST and the projected ca.crt), runs
// a shared informer on ConfigMaps of its namespace, and prints one line
// per event it sees, "synced" once the informer has listed, so that the
// test reads from its log what it listed and watched.
//
// With -get URL it instead sends one GET with its service account's token,
// as Prometheus scrapes with a ServiceMonitor's bearerTokenFile and
// insecureSkipVerify, prints "status <code>" and exits.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

const tokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"

func main() {
	get := flag.String("get", "", "Send one GET to this URL with the service account's token, print its status, exit.")
	flag.Parse()
	run := informer
	if *get != "" {
		run = func() error { return scrape(*get) }
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

func scrape(url string) error {
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+string(token))
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // as the chart's ServiceMonitor
	}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	fmt.Printf("status %d\n", resp.StatusCode)
	return nil
}

func informer() error {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return err
	}
	fmt.Printf("server %s\n", cfg.Host)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 10*time.Minute, informers.WithNamespace(string(ns)))
	inf := factory.Core().V1().ConfigMaps().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { fmt.Printf("add %s\n", obj.(*corev1.ConfigMap).Name) },
		UpdateFunc: func(_, obj any) {
			fmt.Printf("update %s\n", obj.(*corev1.ConfigMap).Name)
		},
		DeleteFunc: func(obj any) {
			if cm, ok := obj.(*corev1.ConfigMap); ok {
				fmt.Printf("delete %s\n", cm.Name)
			}
		},
	}); err != nil {
		return err
	}
	stop := make(chan struct{})
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-signals; close(stop) }()
	factory.Start(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		return fmt.Errorf("informer did not sync")
	}
	fmt.Println("synced")
	<-stop
	factory.Shutdown()
	return nil
}
