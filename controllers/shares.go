package controllers

import (
	"cmp"
	"context"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/watchgate/watchgate/internal/periodic"
	"github.com/watchgate/watchgate/ratelimit"
)

// Budgets shared by several replicas go through Leases in the replicas'
// namespace: each replica renews its own demand Lease (named
// DemandLeasePrefix + its pod name, labelled ShareLabel=ShareLabelDemand)
// with its engine's Demand in the DemandAnnotation and the Generation of
// the allocation it enforces in the AppliedAnnotation; the leader reads the
// live ones, computes the next ratelimit.Allocation and writes it to the
// SharesLease's SharesAnnotation; each replica reads that and enforces its
// fractions (Engine.SetShares).
const (
	DemandLeasePrefix = "watchgate-demand-"
	SharesLease       = "watchgate-shares"
	ShareLabel        = "watchgate.io/share"
	ShareLabelDemand  = "demand"
	ShareLabelShares  = "shares"
	DemandAnnotation  = "watchgate.io/demand"
	AppliedAnnotation = "watchgate.io/shares-applied"
	SharesAnnotation  = "watchgate.io/shares"
)

// Defaults of the share exchange.
const (
	// DefaultShareInterval is how often replicas report and the leader
	// allocates, as KubeGateway's limiter allocation.
	DefaultShareInterval = 2 * time.Second
	// DefaultShareLeaseDuration is how long a replica's demand Lease
	// counts it live without a renewal: a replica lost returns its share
	// to the others this long after its last renewal (plus an interval).
	DefaultShareLeaseDuration = 10 * time.Second
	// DefaultShareIdentities is how many identities of each budget get a
	// share of their own: those of the highest demand.
	DefaultShareIdentities = 32
	// shareHistory is how many written allocations the leader keeps to
	// know what a replica that has not read the newest may enforce.
	shareHistory = 8
	// maxShareBytes bounds the JSON a Lease annotation carries (the API
	// server allows 256 KiB of annotations): beyond it, fewer identities.
	maxShareBytes = 128 << 10
)

// ShareEngine is what the share exchange needs of the engine.
type ShareEngine interface {
	Demand(now time.Time, n int) map[string]ratelimit.Demand
	SetShares(now time.Time, s *ratelimit.Shares)
}

var _ ShareEngine = (*ratelimit.Engine)(nil)

// ShareReporter runs on every replica. Every Interval it reads the
// SharesLease and, when it changed, makes the engine enforce this
// replica's fractions; then it renews its demand Lease with the engine's
// Demand and the generation it now enforces (writing only when either
// changed or a third of LeaseDuration passed), so that the leader learns
// at once that a shrink is in force.
//
// Fail-static: when the API server cannot be reached, or no leader writes
// the allocation, the replica keeps the fractions it enforces. Before any
// allocation names it, it enforces every budget split evenly over the live
// demand Leases (its own included), or over Replicas when they are fewer.
type ShareReporter struct {
	// Client writes and Reader reads the Leases (the API server, not a
	// cache: only the namespace's Leases are readable).
	Client client.Client
	Reader client.Reader
	Engine ShareEngine
	// Pod is this replica's name; Namespace the Leases'.
	Pod, Namespace string
	// Replicas is how many replicas there are expected to be, for the
	// even split before the first reading; at most 1 enforces budgets
	// whole until then.
	Replicas int
	// Interval, LeaseDuration and MaxIdentities default to
	// DefaultShareInterval, DefaultShareLeaseDuration and
	// DefaultShareIdentities.
	Interval, LeaseDuration time.Duration
	MaxIdentities           int
	Clock                   clock.Clock

	writes atomic.Int64

	lease       *coordinationv1.Lease
	lastDemand  string
	lastApplied int64
	renewedAt   time.Time
	sharesRV    string
	evenN       int
	// applied is the Generation of the allocation the engine enforces:
	// 0 for an even split.
	applied int64
}

// Writes is how many API-server writes the reporter made.
func (r *ShareReporter) Writes() int64 { return r.writes.Load() }

// NeedLeaderElection is false: every replica reports and enforces.
func (r *ShareReporter) NeedLeaderElection() bool { return false }

// shareDefaults fills in the reporter's and the allocator's zero settings:
// DefaultShareInterval, DefaultShareLeaseDuration, DefaultShareIdentities
// and the real clock.
func shareDefaults(interval, lease *time.Duration, maxIdentities *int, clk *clock.Clock) {
	if *interval <= 0 {
		*interval = DefaultShareInterval
	}
	if *lease <= 0 {
		*lease = DefaultShareLeaseDuration
	}
	if *maxIdentities <= 0 {
		*maxIdentities = DefaultShareIdentities
	}
	if *clk == nil {
		*clk = clock.RealClock{}
	}
}

func (r *ShareReporter) defaults() {
	shareDefaults(&r.Interval, &r.LeaseDuration, &r.MaxIdentities, &r.Clock)
}

// Start reports every Interval until ctx ends, then deletes its demand
// Lease so the leader returns its share to the others at once.
func (r *ShareReporter) Start(ctx context.Context) error {
	r.defaults()
	if r.Replicas > 1 {
		r.Engine.SetShares(r.Clock.Now(), ratelimit.EqualShares(r.Replicas))
		r.evenN = r.Replicas
	}
	periodic.NowAndEvery(ctx, r.Clock, r.Interval, r.Step)
	del, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r.lease != nil {
		_ = r.Client.Delete(del, r.lease) // best effort: the Lease expires anyway
	}
	return nil
}

// Step applies the allocation and reports once, logging what failed.
func (r *ShareReporter) Step(ctx context.Context) {
	r.defaults()
	log := logf.FromContext(ctx).WithName("shares")
	if err := r.apply(ctx); err != nil {
		log.V(1).Info("Cannot read the shares; keeping the current ones", "err", err.Error())
	}
	if err := r.report(ctx); err != nil {
		log.V(1).Info("Cannot report demand", "err", err.Error())
	}
}

// report renews the demand Lease.
func (r *ShareReporter) report(ctx context.Context) error {
	now := r.Clock.Now()
	d := r.Engine.Demand(now, r.MaxIdentities)
	for _, bd := range d {
		for user, u := range bd.Identities {
			bd.Identities[user] = math.Round(u*100) / 100
		}
		for user, h := range bd.Held {
			bd.Held[user] = math.Ceil(h*1000) / 1000
		}
	}
	demand := marshalBounded(r.MaxIdentities, func(n int) any { return topDemand(d, n) })
	if demand == r.lastDemand && r.applied == r.lastApplied && r.lease != nil && now.Sub(r.renewedAt) < r.LeaseDuration/3 {
		return nil
	}
	name := DemandLeasePrefix + r.Pod
	if r.lease == nil {
		l := &coordinationv1.Lease{}
		err := r.Reader.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, l)
		if apierrors.IsNotFound(err) {
			l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name}}
		} else if err != nil {
			return err
		}
		r.lease = l
	}
	l := r.lease.DeepCopy()
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[ShareLabel] = ShareLabelDemand
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[DemandAnnotation] = demand
	l.Annotations[AppliedAnnotation] = strconv.FormatInt(r.applied, 10)
	l.Spec.HolderIdentity = ptr.To(r.Pod)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(math.Ceil(r.LeaseDuration.Seconds())))
	l.Spec.RenewTime = &metav1.MicroTime{Time: now}
	var err error
	if l.ResourceVersion == "" {
		err = r.Client.Create(ctx, l)
	} else {
		err = r.Client.Update(ctx, l)
	}
	r.writes.Add(1)
	if err != nil {
		r.lease = nil // read it again next time
		return err
	}
	r.lease, r.lastDemand, r.lastApplied, r.renewedAt = l, demand, r.applied, now
	return nil
}

// apply reads the allocation and makes the engine enforce this replica's
// fractions of it.
func (r *ShareReporter) apply(ctx context.Context) error {
	now := r.Clock.Now()
	l := &coordinationv1.Lease{}
	err := r.Reader.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: SharesLease}, l)
	if err == nil && l.Annotations[SharesAnnotation] != "" {
		if l.ResourceVersion == r.sharesRV {
			return nil
		}
		var a ratelimit.Allocation
		if err := json.Unmarshal([]byte(l.Annotations[SharesAnnotation]), &a); err != nil {
			return err
		}
		s, _ := a.Shares(r.Pod)
		r.Engine.SetShares(now, s)
		r.sharesRV, r.evenN, r.applied = l.ResourceVersion, 0, a.Generation
		return nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// No allocation yet: split evenly over the live replicas.
	live, err := liveDemand(ctx, r.Reader, r.Namespace, now, 0)
	if err != nil {
		return err
	}
	n := len(live)
	if _, ok := live[r.Pod]; !ok {
		n++
	}
	n = max(n, r.Replicas)
	if n != r.evenN || r.sharesRV != "" {
		r.Engine.SetShares(now, ratelimit.EqualShares(n))
		r.evenN, r.sharesRV, r.applied = n, "", 0
	}
	return nil
}

// liveDemand reads the demand Leases of namespace renewed within their
// duration at now, by replica. A Lease without the AppliedAnnotation (a
// replica of an older version) reports newest as applied.
func liveDemand(ctx context.Context, reader client.Reader, namespace string, now time.Time, newest int64) (map[string]ratelimit.Report, error) {
	var list coordinationv1.LeaseList
	if err := reader.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{ShareLabel: ShareLabelDemand}); err != nil {
		return nil, err
	}
	live := map[string]ratelimit.Report{}
	for i := range list.Items {
		l := &list.Items[i]
		s := l.Spec
		if s.HolderIdentity == nil || s.RenewTime == nil || s.LeaseDurationSeconds == nil ||
			now.After(s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds)*time.Second)) {
			continue
		}
		rep := ratelimit.Report{Replica: *s.HolderIdentity, Applied: newest}
		if err := json.Unmarshal([]byte(l.Annotations[DemandAnnotation]), &rep.Budgets); err != nil {
			rep.Budgets = nil // a live replica whose demand is unreadable still counts
		}
		if v, ok := l.Annotations[AppliedAnnotation]; ok {
			if g, err := strconv.ParseInt(v, 10, 64); err == nil {
				rep.Applied = g
			} else {
				rep.Applied = 0 // unreadable: as if it enforced none yet
			}
		}
		live[rep.Replica] = rep
	}
	return live, nil
}

// topDemand is d with at most n identities per budget, those of the
// highest demand.
func topDemand(d map[string]ratelimit.Demand, n int) map[string]ratelimit.Demand {
	out := make(map[string]ratelimit.Demand, len(d))
	for b, bd := range d {
		users := slices.Collect(maps.Keys(bd.Identities))
		slices.SortFunc(users, func(x, y string) int {
			return cmp.Or(cmp.Compare(bd.Identities[y], bd.Identities[x]), cmp.Compare(x, y))
		})
		top := ratelimit.Demand{Identities: make(map[string]float64, min(n, len(users)))}
		for _, u := range users[:min(n, len(users))] {
			top.Identities[u] = bd.Identities[u]
			if h, ok := bd.Held[u]; ok {
				if top.Held == nil {
					top.Held = map[string]float64{}
				}
				top.Held[u] = h
			}
		}
		out[b] = top
	}
	return out
}

// marshalBounded is the JSON of build(n) for the largest n ≤ max, halving
// it, whose JSON fits maxShareBytes.
func marshalBounded(n int, build func(n int) any) string {
	for {
		b, err := json.Marshal(build(n))
		if err == nil && (len(b) <= maxShareBytes || n <= 1) {
			return string(b)
		}
		n /= 2
	}
}

// ShareAllocator runs on the leader. Every Interval it reads the live
// demand Leases, computes the next allocation (ratelimit.Allocate) and
// writes it to the SharesLease when any fraction moved by more than 1/100
// or the live replicas changed.
type ShareAllocator struct {
	Client    client.Client
	Reader    client.Reader
	Namespace string
	// Pod names the leader in the SharesLease's holder.
	Pod                     string
	Interval, LeaseDuration time.Duration
	MaxIdentities           int
	Clock                   clock.Clock

	writes atomic.Int64

	// history holds the allocations written, oldest first: the last is
	// in force, and each replica may still enforce any from the one it
	// applied on.
	history []*ratelimit.Allocation
	read    bool
}

// Writes is how many API-server writes the allocator made.
func (a *ShareAllocator) Writes() int64 { return a.writes.Load() }

// NeedLeaderElection is true: one allocator at a time.
func (a *ShareAllocator) NeedLeaderElection() bool { return true }

// Start allocates every Interval until ctx ends.
func (a *ShareAllocator) Start(ctx context.Context) error {
	a.defaults()
	periodic.NowAndEvery(ctx, a.Clock, a.Interval, func(ctx context.Context) {
		if err := a.Step(ctx); err != nil {
			logf.FromContext(ctx).WithName("shares").V(1).Info("Cannot allocate shares", "err", err.Error())
		}
	})
	return nil
}

func (a *ShareAllocator) defaults() {
	shareDefaults(&a.Interval, &a.LeaseDuration, &a.MaxIdentities, &a.Clock)
}

// Step allocates once.
func (a *ShareAllocator) Step(ctx context.Context) error {
	a.defaults()
	now := a.Clock.Now()
	if !a.read {
		// A new leader goes on from what the last one wrote.
		l, err := a.sharesLease(ctx)
		if err != nil {
			return err
		}
		var last ratelimit.Allocation
		if v := l.Annotations[SharesAnnotation]; v != "" && json.Unmarshal([]byte(v), &last) == nil {
			a.history = []*ratelimit.Allocation{&last}
		}
		a.read = true
	}
	var newest int64
	if len(a.history) > 0 {
		newest = a.history[len(a.history)-1].Generation
	}
	live, err := liveDemand(ctx, a.Reader, a.Namespace, now, newest)
	if err != nil {
		return err
	}
	if len(live) == 0 {
		return nil
	}
	reports := slices.Collect(maps.Values(live))
	var next *ratelimit.Allocation
	data := marshalBounded(a.MaxIdentities, func(n int) any {
		next = ratelimit.Allocate(a.history, reports, n)
		return next
	})
	if len(a.history) > 0 && !moved(a.history[len(a.history)-1], next) {
		return nil
	}
	l, err := a.sharesLease(ctx)
	if err != nil {
		return err
	}
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[ShareLabel] = ShareLabelShares
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[SharesAnnotation] = data
	l.Spec.HolderIdentity = ptr.To(a.Pod)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(math.Ceil(a.LeaseDuration.Seconds())))
	l.Spec.RenewTime = &metav1.MicroTime{Time: now}
	if l.ResourceVersion == "" {
		err = a.Client.Create(ctx, l)
	} else {
		err = a.Client.Update(ctx, l)
	}
	a.writes.Add(1)
	if err != nil {
		return err
	}
	a.history = append(a.history, next)
	if len(a.history) > shareHistory {
		a.history = slices.Delete(a.history, 0, len(a.history)-shareHistory)
	}
	return nil
}

// sharesLease reads the SharesLease, or returns a new one to create.
func (a *ShareAllocator) sharesLease(ctx context.Context) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	err := a.Reader.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: SharesLease}, l)
	if apierrors.IsNotFound(err) {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: a.Namespace, Name: SharesLease}}, nil
	}
	return l, err
}

// moved reports whether next differs from prev by its replicas, its
// identities, or any fraction by more than 1/100.
func moved(prev, next *ratelimit.Allocation) bool {
	if len(prev.Replicas) != len(next.Replicas) || len(prev.Budgets) != len(next.Budgets) {
		return true
	}
	for i := range prev.Replicas {
		if prev.Replicas[i] != next.Replicas[i] {
			return true
		}
	}
	for b, ids := range next.Budgets {
		old, ok := prev.Budgets[b]
		if !ok || len(old) != len(ids) {
			return true
		}
		for user, fs := range ids {
			ofs, ok := old[user]
			if !ok || len(ofs) != len(fs) {
				return true
			}
			for i := range fs {
				if math.Abs(fs[i]-ofs[i]) > 0.01 {
					return true
				}
			}
		}
	}
	return false
}
