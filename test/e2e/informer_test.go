package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// seen records what an informer's handlers were told, by name.
type seen struct {
	mu   sync.Mutex
	data map[string]string // name → data["v"], deleted names removed
}

func (s *seen) set(obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.data[cm.Name] = cm.Data["v"]
}

func (s *seen) del(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if cm, ok := obj.(*corev1.ConfigMap); ok {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.data, cm.Name)
	}
}

func (s *seen) equals(want map[string]string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.data) != len(want) {
		return false
	}
	for k, v := range want {
		if got, ok := s.data[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// A client-go informer through the proxy lists, watches, sees every event,
// survives watch timeouts (the server ends each watch after 2 s) and a 410
// relist (its version goes stale while its namespace is quiet), in JSON and
// in protobuf.
func TestInformerThroughProxy(t *testing.T) {
	for _, protobuf := range []bool{false, true} {
		t.Run(fmt.Sprintf("protobuf=%v", protobuf), func(t *testing.T) {
			ctx := context.Background()
			ns := uniqueName(fmt.Sprintf("informer-%v", protobuf))
			sa := serviceAccount(t, ns, "agent", readWatch("configmaps"))
			p := startProxy(t, generous("everyone", 100))
			cs, err := kubernetes.NewForConfig(p.Config(sa.Token, protobuf))
			if err != nil {
				t.Fatal(err)
			}
			admin := env.Clientset.CoreV1().ConfigMaps(ns)
			want := map[string]string{}
			put := func(name, v string) {
				t.Helper()
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": v}}
				if _, err := admin.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					if _, err := admin.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				want[name] = v
			}
			for i := range 20 {
				put(fmt.Sprintf("before-%d", i), "1")
			}

			lw := &cache.ListWatch{
				ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
					return cs.CoreV1().ConfigMaps(ns).List(ctx, o)
				},
				WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
					o.TimeoutSeconds = ptrTo(int64(2))
					return cs.CoreV1().ConfigMaps(ns).Watch(ctx, o)
				},
			}
			got := &seen{data: map[string]string{}}
			inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
			if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    got.set,
				UpdateFunc: func(_, obj any) { got.set(obj) },
				DeleteFunc: got.del,
			}); err != nil {
				t.Fatal(err)
			}
			ictx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Go(func() { inf.RunWithContext(ictx) })
			t.Cleanup(func() { stop(); wg.Wait() })

			eventually(t, 30*time.Second, "the initial list", func() (bool, error) { return got.equals(want), nil })

			// Events across several watch timeouts.
			ended := proxyMetric(t, "watchgate_proxy_watches_ended_total", nil)
			for i := range 5 {
				put(fmt.Sprintf("before-%d", i), "2")
				put(fmt.Sprintf("during-%d", i), "1")
				if err := admin.Delete(ctx, fmt.Sprintf("before-%d", 10+i), metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				delete(want, fmt.Sprintf("before-%d", 10+i))
				time.Sleep(time.Second) // spread the changes over watch timeouts, not an assertion
			}
			eventually(t, 30*time.Second, "every event across watch timeouts", func() (bool, error) { return got.equals(want), nil })
			if n := proxyMetric(t, "watchgate_proxy_watches_ended_total", nil) - ended; n < 2 {
				t.Errorf("watches ended during the test = %v, want >= 2 (the server times them out every 2s)", n)
			}

			// The namespace goes quiet while others churn: the informer's
			// version goes stale, its next watch gets 410 and it relists.
			learned := proxyMetric(t, "watchgate_proxy_stale_versions_learned_total", nil)
			other := env.Clientset.CoreV1().ConfigMaps("default")
			for range 100 {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "churn-"}}
				if _, err := other.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, 60*time.Second, "a 410 in the informer's watch stream", func() (bool, error) {
				return proxyMetric(t, "watchgate_proxy_stale_versions_learned_total", nil) > learned, nil
			})
			put("after-relist", "1")
			put("before-0", "3")
			eventually(t, 30*time.Second, "every event after the relist", func() (bool, error) { return got.equals(want), nil })
		})
	}
}
