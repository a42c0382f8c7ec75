// Command storm is the seed incident's agent, run in a pod: like Rancher's
// cluster agent, it serves many users' dashboards by impersonating each of
// them (its service account may impersonate users), and each dashboard
// re-subscribes the moment its watch ends, from a resourceVersion the API
// server has declared too old. It builds its config with
// rest.InClusterConfig, so in a routed pod every request goes through
// watchgate.
//
// Each of -users users (dashboard-0, dashboard-1, …) loops on PodTemplates
// of the pod's namespace from one of -resource-versions (user i takes the
// i-th, round robin) for -duration, then it prints one line
//
//	attempts N expired E other O
//
// (watches opened, answered ERROR 410 Expired, anything else) and, for
// the first few "other" answers, what they were.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func main() {
	users := flag.Int("users", 20, "Users to impersonate, one dashboard each.")
	versions := flag.String("resource-versions", "", "Comma-separated stale resourceVersions the dashboards re-subscribe from.")
	duration := flag.Duration("duration", 15*time.Second, "How long the dashboards loop.")
	flag.Parse()
	if err := run(*users, strings.Split(*versions, ","), *duration); err != nil {
		fmt.Fprintln(os.Stderr, "storm:", err)
		os.Exit(1)
	}
}

type tally struct {
	attempts, expired, other atomic.Int64
	mu                       sync.Mutex
	notes                    []string
}

func (t *tally) note(s string) {
	t.other.Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.notes) < 5 {
		t.notes = append(t.notes, s)
	}
}

func run(users int, versions []string, d time.Duration) error {
	if users < 1 || len(versions) == 0 || versions[0] == "" {
		return errors.New("need -users >= 1 and -resource-versions")
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return err
	}
	fmt.Printf("server %s\n", cfg.Host)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var t tally
	var wg sync.WaitGroup
	for i := range users {
		c := rest.CopyConfig(cfg)
		c.Impersonate = rest.ImpersonationConfig{UserName: fmt.Sprintf("dashboard-%d", i)}
		cs, err := kubernetes.NewForConfig(c)
		if err != nil {
			return err
		}
		rv := versions[i%len(versions)]
		wg.Go(func() {
			for ctx.Err() == nil {
				resubscribe(ctx, cs, string(ns), rv, &t)
			}
		})
	}
	wg.Wait()
	fmt.Printf("attempts %d expired %d other %d\n", t.attempts.Load(), t.expired.Load(), t.other.Load())
	for _, n := range t.notes {
		fmt.Println("other:", n)
	}
	return nil
}

// resubscribe opens one watch from rv and reads it to its end.
func resubscribe(ctx context.Context, cs kubernetes.Interface, ns, rv string, t *tally) {
	w, err := cs.CoreV1().PodTemplates(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if ctx.Err() != nil {
		return
	}
	t.attempts.Add(1)
	if err != nil {
		t.note(err.Error())
		time.Sleep(100 * time.Millisecond)
		return
	}
	defer w.Stop()
	first := true
	for ev := range w.ResultChan() {
		if !first {
			continue
		}
		first = false
		if s, ok := ev.Object.(*metav1.Status); ok && ev.Type == watch.Error && s.Code == http.StatusGone {
			t.expired.Add(1)
			continue
		}
		t.note(fmt.Sprintf("%s %T", ev.Type, ev.Object))
	}
	if first && ctx.Err() == nil {
		t.note("the watch ended without an event")
	}
}
