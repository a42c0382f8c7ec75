package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/api/v1alpha1"
	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
)

// Known traffic through two replicas' engines — 20 identities at 5 watch
// opens a minute (one every 12 s), 10 on each replica, and 2 at 60 (two a
// second) on the second — becomes each replica's sketch in its own entry,
// and the leader's suggestion in status.suggested: the quiet identities'
// peaks times the headroom, the 2 loud ones left out by a 90% share and
// counted as refused by the current limits (20/min, burst 5: 25 opens in a
// minute at most). Their watches end within a millisecond — failures, to
// the budget's default backoff — and the loud ones reopen within the
// delay, so backoff holds them back whatever the limits (refusedAnyway).
// `kubectl get wb -o wide` shows it, `kubectl describe`
// details it, and the entries name no identity. Raising the share to 95%
// takes in a loud identity.
func TestSuggestedLimitsFromObservedTraffic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := controllers.Options{CounterRefreshInterval: 100 * time.Millisecond}
	opts.PodName = "suggest-a"
	a := startReplica(t, replicaOptions{Options: opts})
	opts.PodName = "suggest-b"
	b := startReplica(t, replicaOptions{Options: opts})
	const name = "suggest"
	createBudget(t, &v1alpha1.WatchBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.WatchBudgetSpec{
			Precedence:  50,
			Enforcement: v1alpha1.EnforcementDryRun,
			Subjects:    []v1alpha1.Subject{{Kind: v1alpha1.SubjectKindUser, Name: "suggest-*"}},
			Limits:      v1alpha1.Limits{WatchOpensPerMinute: ptr.To[int32](20), WatchBurst: ptr.To[int32](5)},
			Suggestion:  v1alpha1.Suggestion{Share: ptr.To[int32](90)},
		},
	})
	for _, r := range []*replica{a, b} {
		eventually(t, reloadDeadline, "the budget reaches both engines", func() error {
			_, err := policyBudget(r.engine, name)
			return err
		})
	}

	// Each identity's opens fall in one calendar minute, the one that
	// started at most a minute ago.
	start := time.Now().Truncate(time.Minute)
	drive := func(e *ratelimit.Engine, user string, opens int, every time.Duration) {
		for k := range opens {
			at := start.Add(time.Duration(k) * every)
			d := e.Decide(at, &ratelimit.Request{User: user, Verb: ratelimit.VerbWatch, Resource: "configmaps", Namespace: "default", ResourceVersion: "5"})
			if !d.Allowed {
				t.Fatalf("DryRun refused %s: %+v", user, d)
			}
			e.WatchEnded(at, d.Watch, time.Millisecond, ratelimit.OutcomeClosed)
		}
	}
	for u := range 20 {
		e := a.engine
		if u%2 == 1 {
			e = b.engine
		}
		drive(e, fmt.Sprintf("suggest-quiet-%d", u), 5, 12*time.Second)
	}
	for u := range 2 {
		drive(b.engine, fmt.Sprintf("suggest-loud-%d", u), 60, 500*time.Millisecond)
	}

	want := v1alpha1.SuggestedLimits{Summary: "8/min b2 w2", WatchOpensPerMinute: 8, WatchBurst: 2, MaxConcurrentWatches: 2, WouldRefuse: 2, RefusedAnyway: 2, Identities: 22}
	eventually(t, 10*time.Second, "the suggestion from both replicas", suggestionIs(name, want))

	wb := getBudget(t, name)
	for _, r := range wb.Status.Replicas {
		raw, err := json.Marshal(r.Observed)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(raw), "suggest-") {
			t.Errorf("the sketch of %s names an identity: %s", r.Pod, raw)
		}
	}
	// The replicas started observing when the budget reached them.
	if s := wb.Status.Suggested.Since; s == nil || s.Before(&wb.CreationTimestamp) || s.After(time.Now()) {
		t.Errorf("suggestion since %v, want between the budget's creation %v and now", s, wb.CreationTimestamp)
	}

	wide, err := env.Kubectl(ctx, "get", "wb", name, "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(wide, "SUGGESTED") || !strings.Contains(wide, want.Summary) {
		t.Errorf("kubectl get wb -o wide does not show the suggestion %q:\n%s", want.Summary, wide)
	}
	plain, err := env.Kubectl(ctx, "get", "wb", name)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain, "SUGGESTED") {
		t.Errorf("kubectl get wb shows the suggestion without -o wide:\n%s", plain)
	}
	described, err := env.Kubectl(ctx, "describe", "wb", name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl describe wb %s:\n%s", name, described)
	for _, line := range []string{"Suggested:", "Watch Opens Per Minute: 8", "Would Refuse: 2", "Refused Anyway: 2", "Identities: 22"} {
		if !strings.Contains(collapse(described), line) {
			t.Errorf("kubectl describe lacks %q:\n%s", line, described)
		}
	}

	// A wider share takes in one loud identity: 60 opens a minute, in the
	// bucket [60, 63], times 1.5.
	// The replicas write the budget's status meanwhile: update the latest.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		wb := getBudget(t, name)
		wb.Spec.Suggestion.Share = ptr.To[int32](95)
		return admin.Update(ctx, wb)
	})
	if err != nil {
		t.Fatal(err)
	}
	want = v1alpha1.SuggestedLimits{Summary: "95/min b3 w2", WatchOpensPerMinute: 95, WatchBurst: 3, MaxConcurrentWatches: 2, WouldRefuse: 2, RefusedAnyway: 2, Identities: 22}
	eventually(t, 10*time.Second, "the suggestion for a 95% share", suggestionIs(name, want))
}

// suggestionIs checks the budget's status.suggested, its since aside.
func suggestionIs(name string, want v1alpha1.SuggestedLimits) func() error {
	return func() error {
		var wb v1alpha1.WatchBudget
		if err := admin.Get(context.Background(), client.ObjectKey{Name: name}, &wb); err != nil {
			return err
		}
		got := wb.Status.Suggested
		if got == nil {
			return fmt.Errorf("no suggestion; entries %+v", wb.Status.Replicas)
		}
		g := *got
		g.Since = nil
		if g != want {
			return fmt.Errorf("suggested %+v, want %+v", g, want)
		}
		return nil
	}
}
