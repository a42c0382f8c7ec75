package e2e

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// BenchmarkProxyOverhead compares the same requests of the same service
// account made directly to the API server and through the proxy: a GET, a
// LIST of 100 config maps, and opening a watch (until its response headers).
// Run it alone, e.g.
//
//	go test -run '^$' -bench BenchmarkProxyOverhead -benchtime 300x ./test/e2e/
func BenchmarkProxyOverhead(b *testing.B) {
	ctx := context.Background()
	ns := uniqueName("bench")
	sa := serviceAccount(b, ns, "bench", readWatch("configmaps"))
	for i := range 100 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}, Data: map[string]string{"k": "v"}}
		if _, err := env.Clientset.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	p := startProxy(b, generous("everyone", 100))
	direct, err := kubernetes.NewForConfig(env.ConfigFor(sa.Token, "", nil))
	if err != nil {
		b.Fatal(err)
	}
	proxied, err := kubernetes.NewForConfig(p.Config(sa.Token, false))
	if err != nil {
		b.Fatal(err)
	}
	ops := map[string]func(kubernetes.Interface) error{
		"get": func(cs kubernetes.Interface) error {
			_, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "cm-0", metav1.GetOptions{})
			return err
		},
		"list100": func(cs kubernetes.Interface) error {
			_, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
			return err
		},
		"watchOpen": func(cs kubernetes.Interface) error {
			w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: "0", TimeoutSeconds: ptrTo(int64(30))})
			if err == nil {
				w.Stop()
			}
			return err
		},
	}
	for _, op := range []string{"get", "list100", "watchOpen"} {
		for _, via := range []struct {
			name string
			cs   kubernetes.Interface
		}{{"direct", direct}, {"proxy", proxied}} {
			b.Run(op+"/"+via.name, func(b *testing.B) {
				for b.Loop() {
					if err := ops[op](via.cs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
