package apiserver

import (
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/cert"
)

// The aggregated API server's group, version and resources.
const (
	AggregatedGroup   = "loops.watchgate.io"
	AggregatedVersion = "v1"
	// BrokenResource's watch-lists send their initial ADDED events but
	// never the bookmark that ends them (annotation
	// k8s.io/initial-events-end), as in kubernetes#140890; each ends after
	// Aggregated.WatchListLife.
	BrokenResource = "widgets"
	// HealthyResource's watch-lists end their initial events with that
	// bookmark and stay open, as kube-apiserver's do.
	HealthyResource = "gadgets"
)

// Aggregated is a small aggregated API server served from the test
// process and registered with the test bed's kube-apiserver as the
// APIService v1.loops.watchgate.io, so that requests for its resources go
// through kube-apiserver's aggregator like those of any aggregated API
// server (metrics-server, a tenant's extension API). It serves discovery,
// LIST and WATCH of two cluster-scoped resources with ItemsPerList
// objects each: BrokenResource, whose watch-lists never send their
// initial-events-end bookmark, and HealthyResource, whose watch-lists do.
// Every answer is JSON, a watch-list gzip-encoded when the client accepts
// gzip (as kube-apiserver 1.37 answers client-go's); nothing is
// authenticated (kube-apiserver has authenticated and authorized the
// caller before it proxies).
//
// It counts the requests that reached it, per resource: what a client did
// to kube-apiserver, seen from behind it.
type Aggregated struct {
	// WatchListLife is how long a watch-list of BrokenResource stays open
	// after its initial events before the server ends it. A client-go
	// reflector opens the next one at once.
	WatchListLife time.Duration

	server *http.Server
	counts sync.Map // resource + "/" + kind → *atomic.Int64
	apiSvc string
	// stop ends every open watch when the server stops.
	stop chan struct{}
}

// ItemsPerList is the number of objects each resource holds.
const ItemsPerList = 3

// The kinds of request Aggregated counts.
const (
	KindList      = "list"
	KindWatch     = "watch"
	KindWatchList = "watchlist"
)

// aggregatedService names the ExternalName Service the APIService points
// at, in namespace default.
const aggregatedService = "watchgate-loops"

// StartAggregated serves the aggregated API server on a free loopback port
// and registers it (an ExternalName Service "localhost", which
// kube-apiserver's aggregator resolves without endpoints, and the
// APIService with the serving certificate's CA); it returns once
// kube-apiserver reports the APIService Available and serves its
// discovery. Stop unregisters and stops it.
func (e *Env) StartAggregated(ctx context.Context) (*Aggregated, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	_, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey(aggregatedService+".default.svc", []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"})
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	a := &Aggregated{WatchListLife: 100 * time.Millisecond, stop: make(chan struct{}), apiSvc: AggregatedVersion + "." + AggregatedGroup}
	a.server = &http.Server{
		Handler:           a,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() { _ = a.server.ServeTLS(l, "", "") }()

	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		_ = a.server.Close()
		return nil, err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: aggregatedService, Namespace: "default"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"},
	}
	if _, err := e.Clientset.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		_ = a.server.Close()
		return nil, err
	}
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]any{"name": a.apiSvc},
		"spec": map[string]any{
			"group":                AggregatedGroup,
			"version":              AggregatedVersion,
			"groupPriorityMinimum": int64(1000),
			"versionPriority":      int64(15),
			"caBundle":             certPEM,
			"service":              map[string]any{"name": aggregatedService, "namespace": "default", "port": int64(port)},
		},
	}}
	apiServices := dyn.Resource(schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"})
	if _, err := apiServices.Create(ctx, apiService, metav1.CreateOptions{}); err != nil {
		_ = a.server.Close()
		return nil, err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := apiServices.Get(ctx, a.apiSvc, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not registered yet: poll again
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Available" && m["status"] == "True" {
				_, err := e.Clientset.Discovery().ServerResourcesForGroupVersion(AggregatedGroup + "/" + AggregatedVersion)
				return err == nil, nil
			}
		}
		return false, nil
	})
	if err != nil {
		_ = a.Stop(context.Background(), e)
		return nil, fmt.Errorf("APIService %s never became available: %w", a.apiSvc, err)
	}
	return a, nil
}

// Stop unregisters the APIService and its Service and stops serving.
func (a *Aggregated) Stop(ctx context.Context, e *Env) error {
	var errs []error
	if dyn, err := dynamic.NewForConfig(e.Config); err == nil {
		err = dyn.Resource(schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}).
			Delete(ctx, a.apiSvc, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	if err := e.Clientset.CoreV1().Services("default").Delete(ctx, aggregatedService, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	close(a.stop)
	errs = append(errs, a.server.Close())
	return errors.Join(errs...)
}

// Requests returns how many requests of kind (KindList, KindWatch,
// KindWatchList) for resource have reached the server.
func (a *Aggregated) Requests(resource, kind string) int64 {
	if c, ok := a.counts.Load(resource + "/" + kind); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

func (a *Aggregated) count(resource, kind string) {
	c, _ := a.counts.LoadOrStore(resource+"/"+kind, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
}

// kindOf is the Kind of a resource's objects: "widgets" → "Widget".
func kindOf(resource string) string {
	return strings.ToUpper(resource[:1]) + strings.TrimSuffix(resource[1:], "s")
}

// resourceVersion is the (fixed) version of every object and list.
const resourceVersion = "7"

func (a *Aggregated) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	gv := AggregatedGroup + "/" + AggregatedVersion
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch path {
	case "/apis":
		writeJSON(w, &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{group()}})
		return
	case "/apis/" + AggregatedGroup:
		g := group()
		g.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
		writeJSON(w, &g)
		return
	case "/apis/" + gv:
		list := &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: gv}
		for _, res := range []string{BrokenResource, HealthyResource} {
			list.APIResources = append(list.APIResources, metav1.APIResource{
				Name: res, SingularName: strings.TrimSuffix(res, "s"), Kind: kindOf(res), Verbs: []string{"get", "list", "watch"},
			})
		}
		writeJSON(w, list)
		return
	}
	res, ok := strings.CutPrefix(path, "/apis/"+gv+"/")
	if !ok || (res != BrokenResource && res != HealthyResource) || r.Method != http.MethodGet {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound})
		return
	}
	q := r.URL.Query()
	if q.Get("watch") != "true" && q.Get("watch") != "1" {
		a.count(res, KindList)
		list := map[string]any{
			"apiVersion": gv, "kind": kindOf(res) + "List",
			"metadata": map[string]any{"resourceVersion": resourceVersion},
			"items":    items(res),
		}
		writeJSON(w, list)
		return
	}
	watchList := q.Get("sendInitialEvents") == "true"
	if watchList {
		a.count(res, KindWatchList)
	} else {
		a.count(res, KindWatch)
	}
	w.Header().Set("Content-Type", "application/json")
	// As kube-apiserver 1.37 (WatchListCompression): a watch-list for a
	// client that accepts gzip is gzip-encoded, one gzip member per flush.
	gzipped := watchList && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip")
	if gzipped {
		w.Header().Set("Content-Encoding", "gzip")
	}
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if watchList {
		var out io.Writer = w
		var gz *gzip.Writer
		if gzipped {
			gz, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
			out = gz
		}
		enc := json.NewEncoder(out)
		for _, obj := range items(res) {
			_ = enc.Encode(map[string]any{"type": "ADDED", "object": obj})
		}
		if res == HealthyResource {
			_ = enc.Encode(map[string]any{"type": "BOOKMARK", "object": map[string]any{
				"apiVersion": gv, "kind": kindOf(res),
				"metadata": map[string]any{
					"resourceVersion": resourceVersion,
					"annotations":     map[string]any{metav1.InitialEventsAnnotationKey: "true"},
				},
			}})
		}
		if gz != nil {
			// Flushed before it is closed, as kube-apiserver's members
			// are: a reader gets the events at the flush, without waiting
			// for the next member's header.
			_ = gz.Flush()
			_ = gz.Close()
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	life := 5 * time.Minute
	if secs, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && secs > 0 {
		life = time.Duration(secs) * time.Second
	}
	if watchList && res == BrokenResource {
		life = a.WatchListLife
	}
	t := time.NewTimer(life)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	case <-a.stop:
	}
}

func group() metav1.APIGroup {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: AggregatedGroup + "/" + AggregatedVersion, Version: AggregatedVersion}
	return metav1.APIGroup{Name: AggregatedGroup, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv}
}

// items are a resource's objects.
func items(res string) []any {
	out := make([]any, ItemsPerList)
	for i := range out {
		out[i] = map[string]any{
			"apiVersion": AggregatedGroup + "/" + AggregatedVersion, "kind": kindOf(res),
			"metadata": map[string]any{"name": fmt.Sprintf("%s-%d", strings.TrimSuffix(res, "s"), i), "resourceVersion": resourceVersion},
		}
	}
	return out
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
