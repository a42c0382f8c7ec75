//go:build load

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// loadObjects are the ConfigMaps the load's watches select: group g is
// ConfigMap g<g>, labelled load-group=<g>, in namespace <prefix><g mod
// namespaces> (loadclient's watch k selects group k mod groups, by name).
type loadObjects struct {
	prefix             string
	groups, namespaces int
}

func (o loadObjects) namespace(g int) string { return o.prefix + strconv.Itoa(g%o.namespaces) }

// create makes the namespaces and one ConfigMap per group, 32 at a time.
func (o loadObjects) create(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	t.Helper()
	for i := range o.namespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.prefix + strconv.Itoa(i)}}
		if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	groups := make(chan int)
	var failed atomic.Value
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for g := range groups {
				cm := &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Name: "g" + strconv.Itoa(g), Labels: map[string]string{"load-group": strconv.Itoa(g)}},
					Data:       map[string]string{"loadts": "0"},
				}
				if _, err := cs.CoreV1().ConfigMaps(o.namespace(g)).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					failed.Store(err)
				}
			}
		})
	}
	for g := range o.groups {
		groups <- g
	}
	close(groups)
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		t.Fatalf("create the load's ConfigMaps: %v", err)
	}
}

// write updates the groups' ConfigMaps round robin, writesPerSecond of them
// a second, for d, each with its write time (data.loadts, Unix nanoseconds,
// taken just before the request); it answers the writes done and failed.
func (o loadObjects) write(ctx context.Context, cs kubernetes.Interface, writesPerSecond float64, d time.Duration) (done, failed int) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	lim := rate.NewLimiter(rate.Limit(writesPerSecond), 1)
	groups := make(chan int, 64)
	var ok, bad atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for g := range groups {
				patch := fmt.Appendf(nil, `{"data":{"loadts":"%d"}}`, time.Now().UnixNano())
				// Its own context: a write started before the end
				// completes.
				wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := cs.CoreV1().ConfigMaps(o.namespace(g)).Patch(wctx, "g"+strconv.Itoa(g), types.MergePatchType, patch, metav1.PatchOptions{})
				wcancel()
				if err != nil {
					bad.Add(1)
					continue
				}
				ok.Add(1)
			}
		})
	}
	for g := 0; lim.Wait(ctx) == nil; g = (g + 1) % o.groups {
		groups <- g
	}
	close(groups)
	wg.Wait()
	return int(ok.Load()), int(bad.Load())
}
