package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/watchgate/watchgate/controllers"
	"github.com/watchgate/watchgate/ratelimit"
)

// shareBed is three replicas' engines and share reporters, and a leader's
// allocator, exchanging through the real API server's Leases on one fake
// clock: the test calls their rounds in turn, as their tickers would, so it
// decides what happens between rounds. Alice's budget "b" caps her at 30
// concurrent watches.
type shareBed struct {
	t         *testing.T
	ctx       context.Context
	ns        string
	clk       *clocktesting.FakeClock
	engines   []*ratelimit.Engine
	reporters []*controllers.ShareReporter
	leader    *controllers.ShareAllocator
	// watches[i] are alice's watches open on replica i.
	watches [][]ratelimit.Watch
}

func newShareBed(t *testing.T) *shareBed {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	ns := fmt.Sprintf("shares-%d", time.Now().UnixNano())
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	policy, err := ratelimit.NewPolicy([]ratelimit.Budget{{Name: "b", Limits: ratelimit.Limits{MaxConcurrentWatches: 30}}})
	if err != nil {
		t.Fatal(err)
	}
	b := &shareBed{t: t, ctx: ctx, ns: ns, clk: clk, watches: make([][]ratelimit.Watch, 3),
		leader: &controllers.ShareAllocator{Client: admin, Reader: admin, Namespace: ns, Pod: "r0", Clock: clk}}
	for _, name := range []string{"r0", "r1", "r2"} {
		e := ratelimit.NewEngine(ratelimit.Options{Seed: 1})
		e.SetPolicy(clk.Now(), policy)
		b.engines = append(b.engines, e)
		b.reporters = append(b.reporters, &controllers.ShareReporter{Client: admin, Reader: admin, Engine: e, Pod: name, Namespace: ns, Replicas: 3, Clock: clk})
	}
	return b
}

// round advances the clock one interval and runs every live reporter,
// the leader, and the reporters again (to read what it wrote).
func (b *shareBed) round(live ...int) {
	b.t.Helper()
	b.clk.Step(controllers.DefaultShareInterval)
	b.step(live...)
	b.allocate()
	b.step(live...)
}

// step runs the reporters of the replicas listed once.
func (b *shareBed) step(replicas ...int) {
	for _, i := range replicas {
		b.reporters[i].Step(b.ctx)
	}
}

// allocate runs the leader once.
func (b *shareBed) allocate() {
	b.t.Helper()
	if err := b.leader.Step(b.ctx); err != nil {
		b.t.Fatal(err)
	}
}

// open asks replica i for n more watches of alice, and returns how many it
// admitted.
func (b *shareBed) open(i, n int) int {
	got := 0
	for range n {
		d := b.engines[i].Decide(b.clk.Now(), &ratelimit.Request{User: "alice", Verb: ratelimit.VerbWatch, Resource: "pods", ResourceVersion: "1"})
		if d.Allowed {
			got++
			b.watches[i] = append(b.watches[i], d.Watch)
		}
	}
	return got
}

func (b *shareBed) closeAll(i int) {
	for _, w := range b.watches[i] {
		b.engines[i].WatchEnded(b.clk.Now(), w, time.Minute, ratelimit.OutcomeClosed)
	}
	b.watches[i] = nil
}

func (b *shareBed) open3() [3]int {
	return [3]int{len(b.watches[0]), len(b.watches[1]), len(b.watches[2])}
}

func (b *shareBed) total() int { n := b.open3(); return n[0] + n[1] + n[2] }

// TestSharesThroughLeases runs the share exchange of three replicas
// against the real API server, round by round.
func TestSharesThroughLeases(t *testing.T) {
	bed := newShareBed(t)
	ctx, ns, clk, leader, reporters := bed.ctx, bed.ns, bed.clk, bed.leader, bed.reporters
	round, open, closeAll, total, watches := bed.round, bed.open, bed.closeAll, bed.total, bed.watches

	// Before any allocation: a third each.
	round(0, 1, 2)
	// Clients spread over the three: 30 in all, whatever the rounds.
	for range 4 {
		for i := range 3 {
			open(i, 15)
		}
		round(0, 1, 2)
	}
	if got := total(); got < 27 || got > 33 {
		t.Fatalf("alice's watches spread over three replicas: %d open in all (%d, %d, %d), want 30 ± 10%%", got, len(watches[0]), len(watches[1]), len(watches[2]))
	}

	// Its clients all move to r0: its whole budget there within four
	// rounds (eight seconds): r1 and r2 apply their shrink first.
	closeAll(1)
	closeAll(2)
	rounds := 0
	for len(watches[0]) < 30 && rounds < 10 {
		open(0, 30)
		round(0, 1, 2)
		rounds++
	}
	open(0, 30)
	if got := len(watches[0]); got != 30 || rounds > 4 {
		t.Fatalf("alice on r0 alone: %d watches there after %d rounds, want 30 within 4 rounds", got, rounds)
	}
	t.Logf("the whole budget moved to one replica in %d rounds (%v)", rounds, time.Duration(rounds)*controllers.DefaultShareInterval)

	// r2 is lost: within its lease, the others share everything.
	closeAll(0)
	lost := 0
	for leaderSees(t, ctx, ns, "r2") && lost < 20 {
		round(0, 1)
		lost++
	}
	if d := time.Duration(lost) * controllers.DefaultShareInterval; d > controllers.DefaultShareLeaseDuration+controllers.DefaultShareInterval {
		t.Fatalf("r2 still in the allocation %v after it stopped reporting; lease %v", d, controllers.DefaultShareLeaseDuration)
	}
	if got := open(0, 30) + open(1, 30); got < 29 || got > 31 {
		t.Errorf("after r2 was lost, r0 and r1 admit %d of alice's watches, want its whole 30", got)
	}

	writes := int64(0)
	for _, r := range reporters {
		writes += r.Writes()
	}
	t.Logf("writes: reporters %d, leader %d, in %v", writes, leader.Writes(), clk.Since(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
}

// TestSharesWaitForAShrinkToApply: a replica that has not yet read the
// allocation shrinking its fraction may still admit up to its old one, so
// the others grow into that only once it reports having applied it.
func TestSharesWaitForAShrinkToApply(t *testing.T) {
	bed := newShareBed(t)
	bed.round(0, 1, 2)
	// r0 and r1 are saturated at their third; r2 has 4 of its 10.
	bed.open(0, 15)
	bed.open(1, 15)
	bed.open(2, 4)
	// They report; the leader shrinks r2 and grows r0 and r1. r2 is
	// slow: it reads nothing for two of the leader's rounds.
	for range 2 {
		bed.clk.Step(controllers.DefaultShareInterval)
		bed.step(0, 1)
		bed.allocate()
		bed.step(0, 1)
		bed.open(0, 15)
		bed.open(1, 15)
	}
	// Meanwhile r2's clients come: it still enforces its third.
	bed.open(2, 15)
	if got := bed.total(); got > 30+2 {
		t.Fatalf("alice's watches while r2 had not applied its shrink: %d open in all (%v), want at most 30 (+2 for rounding)", got, bed.open3())
	}
	t.Logf("while r2 lagged: %v", bed.open3())
	// Once r2 applied its shrink and said so, the others grow.
	more := 0
	for range 3 {
		bed.round(0, 1, 2)
		more += bed.open(0, 15) + bed.open(1, 15)
	}
	if got := bed.total(); got > 30+2 {
		t.Fatalf("alice's watches after r2 applied: %d open in all (%v), want at most 30 (+2 for rounding)", got, bed.open3())
	}
	t.Logf("after r2 applied: %v (%d more on r0 and r1)", bed.open3(), more)
}

// leaderSees reports whether the allocation in the shares Lease of ns
// names replica.
func leaderSees(t *testing.T, ctx context.Context, ns, replica string) bool {
	t.Helper()
	var l coordinationv1.Lease
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: controllers.SharesLease}, &l); err != nil {
		t.Fatal(err)
	}
	var a ratelimit.Allocation
	if err := json.Unmarshal([]byte(l.Annotations[controllers.SharesAnnotation]), &a); err != nil {
		t.Fatal(err)
	}
	for _, r := range a.Replicas {
		if r == replica {
			return true
		}
	}
	return false
}

// TestSharesAtTenThousandIdentities measures what the exchange costs when
// each of three replicas serves 10,000 identities of one budget: the
// writes per replica and the leader's over a minute of rounds, and the
// size of the Leases, which MaxIdentities bounds whatever the identities.
func TestSharesAtTenThousandIdentities(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := fmt.Sprintf("shares-10k-%d", time.Now().UnixNano())
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(start)
	policy, err := ratelimit.NewPolicy([]ratelimit.Budget{{Name: "b", Limits: ratelimit.Limits{MaxConcurrentWatches: 30, WatchOpensPerMinute: 600, WatchBurst: 100}}})
	if err != nil {
		t.Fatal(err)
	}
	const identities = 10000
	reporters := make([]*controllers.ShareReporter, 3)
	engines := make([]*ratelimit.Engine, 3)
	for i := range reporters {
		engines[i] = ratelimit.NewEngine(ratelimit.Options{Seed: 1})
		engines[i].SetPolicy(clk.Now(), policy)
		reporters[i] = &controllers.ShareReporter{Client: admin, Reader: admin, Engine: engines[i], Pod: fmt.Sprintf("r%d", i), Namespace: ns, Replicas: 3, Clock: clk}
	}
	leader := &controllers.ShareAllocator{Client: admin, Reader: admin, Namespace: ns, Pod: "r0", Clock: clk}
	// Every round each identity opens a watch on each replica (some
	// refused), holding a few: demand that changes every round.
	const rounds = 30 // a minute at the default interval
	for r := range rounds {
		for i, e := range engines {
			for u := range identities {
				if (u+r+i)%7 == 0 {
					e.Decide(clk.Now(), &ratelimit.Request{User: fmt.Sprintf("system:serviceaccount:team-%04d:agent", u), Verb: ratelimit.VerbWatch, Resource: "pods", ResourceVersion: "1"})
				}
			}
		}
		for _, rep := range reporters {
			rep.Step(ctx)
		}
		if err := leader.Step(ctx); err != nil {
			t.Fatal(err)
		}
		clk.Step(controllers.DefaultShareInterval)
	}
	var leases coordinationv1.LeaseList
	if err := admin.List(ctx, &leases, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Items {
		size := 0
		for _, v := range l.Annotations {
			size += len(v)
		}
		t.Logf("Lease %s: %d bytes of annotations", l.Name, size)
		if size > 128<<10 {
			t.Errorf("Lease %s carries %d bytes, beyond 128 KiB", l.Name, size)
		}
	}
	if len(leases.Items) != 4 {
		t.Errorf("%d Leases, want 3 demand Leases and the shares Lease", len(leases.Items))
	}
	elapsed := clk.Since(start)
	for _, rep := range reporters {
		if w := rep.Writes(); w > rounds {
			t.Errorf("%s wrote %d times in %d rounds, more than once a round", rep.Pod, w, rounds)
		}
		t.Logf("%s: %d writes in %v (%.2f/s)", rep.Pod, rep.Writes(), elapsed, float64(rep.Writes())/elapsed.Seconds())
	}
	t.Logf("leader: %d writes in %v (%.2f/s)", leader.Writes(), elapsed, float64(leader.Writes())/elapsed.Seconds())
}

// TestSharesWiredByTheManagers starts three replicas as main does (leader
// election on, Options.Shares), and follows what each engine enforces: a
// third of every budget once the leader allocated, half once the leader
// stopped and another took over.
func TestSharesWiredByTheManagers(t *testing.T) {
	ctx := context.Background()
	ns := fmt.Sprintf("shares-wired-%d", time.Now().UnixNano())
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	replicas := make([]*replica, 3)
	for i := range replicas {
		replicas[i] = startReplica(t, replicaOptions{
			Options: controllers.Options{
				PodName: fmt.Sprintf("wired-%d", i),
				Shares:  &controllers.ShareOptions{Namespace: ns, Interval: 200 * time.Millisecond, LeaseDuration: 2 * time.Second},
			},
			leaseNamespace: ns,
		})
	}
	enforce := func(want float64, of ...*replica) {
		t.Helper()
		eventually(t, 40*time.Second, fmt.Sprintf("every replica enforces %.2f of the budgets", want), func() error {
			for i, r := range of {
				s := r.engine.Shares()
				if s == nil || s.Others < want-0.001 || s.Others > want+0.001 {
					return fmt.Errorf("replica %d enforces %+v", i, s)
				}
			}
			return nil
		})
	}
	enforce(1.0/3, replicas...)
	leader := -1
	for i, r := range replicas {
		select {
		case <-r.elected:
			leader = i
		default:
		}
	}
	if leader < 0 {
		t.Fatal("no replica leads")
	}
	replicas[leader].stop()
	var left []*replica
	for i, r := range replicas {
		if i != leader {
			left = append(left, r)
		}
	}
	enforce(0.5, left...)
}
