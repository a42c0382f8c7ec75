package authn

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/metadata"
	"k8s.io/utils/clock"

	"github.com/watchgate/watchgate/proxy/internal/review"
)

// +kubebuilder:rbac:groups="",resources=serviceaccounts;pods;nodes,verbs=get;list;watch

// boundObjects tells whether the objects a service-account token names
// still exist with the UIDs it names, as kube-apiserver's token validator
// asks its ServiceAccountTokenGetter (k8s.io/kubernetes
// pkg/serviceaccount/claims.go): the service account, and the pod or node
// the token is bound to. It reads their metadata only, with a GET through
// the proxy's own client, and remembers each answer (found for ttl, at most
// MaxFoundTTL, not found for negativeTTL; errors not at all) in a cache
// bounded in count, one GET in flight per object. It keeps no object, only
// a name's UID and deletion time.
//
// Its watches of service accounts, pods and nodes (watchDeletions, in
// boundobjectdeletions.go) correct those answers as the objects change:
// a token whose object is deleted, re-created under another UID, or
// marked for deletion is judged by what the watch saw as soon as the
// event arrives, before kube-apiserver refuses it. MaxFoundTTL bounds how
// long an answer is trusted when the watch is down or not allowed, so a
// token whose pod was deleted is refused at most MaxFoundTTL after the
// deletion, no later than kube-apiserver refuses it. It needs get, list
// and watch on service accounts, pods and nodes (get alone: the watches
// are off).
//
// The GETs a client's tokens cause are bounded per client network, as its
// TokenReviews are (budget): a network sending tokens of ever other
// deleted pods spends its own bucket, then its tokens are reviewed (within
// its bucket of TokenReviews) instead of looked up. Looking again at an
// object found before is not charged (see get).
//
// It is safe for concurrent use.
type boundObjects struct {
	client           metadata.Interface
	cache            *utilcache.LRUExpireCache
	flights          singleflight.Group
	ttl, negativeTTL time.Duration
	timeout          time.Duration
	budget           *review.Budget // nil: unbounded
	// found remembers the objects found within RecentTokensTTL, whose
	// lookups spend no budget; bounded in count like cache.
	found *utilcache.LRUExpireCache

	// mu orders the cache's changes by lookups and by the watches, so
	// that an answer older than an event the watch applied is not
	// remembered after it (see lookup and observe).
	mu sync.Mutex
	// inflight holds the GETs in flight (one per object, see flights).
	inflight map[objectRef]*flight

	// watchBackoff is the delay before a failed watch starts again: 0.8 s
	// doubling to 30 s, each up to half as long again (jitter), back to
	// 0.8 s after a watch that lasted deletionWatchBackoffReset. A test seam.
	watchBackoff wait.Backoff
}

// flight is a GET in flight, and what the watch saw of its object
// meanwhile: changed (an event that may make the answer out of date, or
// a restart of the watch) and deletedUID (the UID of an object of that
// name it saw deleted).
type flight struct {
	changed    bool
	deletedUID string
}

// MaxFoundTTL bounds how long an object found is trusted without a
// watch's word: kube-apiserver remembers a token's authentication for
// 10 s (its token success cache) and reads the objects from its
// informers, so it refuses a token within about 10 s of its object's
// deletion. Watchgate looks again at least as often, so that it never
// serves a revoked token longer than the API server does — even the
// requests it answers itself (a stale version), which the API server never
// sees — when its watch of the objects is down or forbidden; while the
// watch runs, a deletion is applied as soon as it arrives. It costs one
// metadata GET per object in use every 10 s.
const MaxFoundTTL = 10 * time.Second

// errLookupsThrottled: the client network's bucket of lookups is empty.
var errLookupsThrottled = errors.New("too many bound-object lookups from this client network")

// objectRef names one object a token may be bound to.
type objectRef struct {
	resource        string // serviceaccounts, pods, nodes
	namespace, name string
}

// objectState is what boundObjects remembers of an object: found, and if
// so its UID and deletion time (zero: not being deleted).
type objectState struct {
	found   bool
	uid     string
	deleted time.Time
}

// NewBoundObjects returns a cache of the objects tokens are bound to, read
// through client: at most size objects, found ones for ttl (at most
// MaxFoundTTL), missing ones for negativeTTL, each GET bounded by timeout
// and spending budget (per client network, see review.WithRequester; nil:
// unbounded), expiry on clk. Its answers are corrected by its watches
// while watchDeletions runs (ServiceAccountTokens.WatchBoundObjects).
func NewBoundObjects(client metadata.Interface, size int, ttl, negativeTTL, timeout time.Duration, budget *review.Budget, clk clock.PassiveClock) *boundObjects {
	return &boundObjects{
		client: client, cache: utilcache.NewLRUExpireCacheWithClock(size, clk), found: utilcache.NewLRUExpireCacheWithClock(size, clk),
		ttl: min(ttl, MaxFoundTTL), negativeTTL: negativeTTL, timeout: timeout, budget: budget,
		inflight:     map[objectRef]*flight{},
		watchBackoff: wait.Backoff{Duration: 800 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: 30 * time.Second},
	}
}

// get returns what ref is now, from the cache or one GET. A GET of an
// object not found within RecentTokensTTL spends the budget of the client
// network of the request that sends it (one per GET, however many
// requests wait for it); looking again at an object found before spends
// nothing, so that the pods of a node refreshing their objects every
// MaxFoundTTL are not throttled: those GETs are bounded by the objects
// that exist.
func (b *boundObjects) get(ctx context.Context, ref objectRef, now time.Time) (objectState, error) {
	if v, ok := b.cache.Get(ref); ok {
		return v.(objectState), nil
	}
	key := ref.resource + "/" + ref.namespace + "/" + ref.name
	ch := b.flights.DoChan(key, func() (any, error) {
		if v, ok := b.cache.Get(ref); ok {
			return v, nil
		}
		if _, known := b.found.Get(ref); !known && b.budget != nil && !b.budget.Allow(review.RequesterFrom(ctx), review.LaneNew, now) {
			return nil, errLookupsThrottled
		}
		return b.lookup(ctx, ref)
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return objectState{}, res.Err
		}
		return res.Val.(objectState), nil
	case <-ctx.Done():
		return objectState{}, ctx.Err()
	}
}

// lookup GETs ref's metadata and remembers the answer, unless the watch
// of ref's resource saw ref change or started again while the GET was in
// flight (see observe): the answer may then be older than what the watch
// told, and is not remembered; if the watch saw the object it names
// deleted, ref is not found.
func (b *boundObjects) lookup(ctx context.Context, ref objectRef) (objectState, error) {
	f := &flight{}
	b.mu.Lock()
	b.inflight[ref] = f
	b.mu.Unlock()
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
	defer cancel()
	gvr := schema.GroupVersionResource{Version: "v1", Resource: ref.resource}
	var m *metav1.PartialObjectMetadata
	var err error
	if ref.namespace == "" {
		m, err = b.client.Resource(gvr).Get(gctx, ref.name, metav1.GetOptions{})
	} else {
		m, err = b.client.Resource(gvr).Namespace(ref.namespace).Get(gctx, ref.name, metav1.GetOptions{})
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.inflight, ref)
	switch {
	case apierrors.IsNotFound(err):
		st := objectState{}
		if !f.changed {
			b.cache.Add(ref, st, b.negativeTTL)
		}
		b.found.Remove(ref)
		return st, nil
	case err != nil:
		boundObjectLookupErrors.Inc()
		return objectState{}, fmt.Errorf("get %s %s/%s: %w", ref.resource, ref.namespace, ref.name, err)
	}
	st := stateOf(m)
	if f.deletedUID != "" && f.deletedUID == st.uid {
		return objectState{}, nil
	}
	if !f.changed {
		b.cache.Add(ref, st, b.ttl)
	}
	b.found.Add(ref, struct{}{}, RecentTokensTTL)
	return st, nil
}

// stateOf is what boundObjects remembers of an object found.
func stateOf(m *metav1.PartialObjectMetadata) objectState {
	st := objectState{found: true, uid: string(m.UID)}
	if m.DeletionTimestamp != nil {
		st.deleted = m.DeletionTimestamp.Time
	}
	return st
}

// deletionLeeway is kube-apiserver's: an object deleted less than this
// long ago (jwt.DefaultLeeway) still vouches for its tokens.
const deletionLeeway = time.Minute

// holds reports whether the object ref still exists at now with uid, as
// kube-apiserver decides it: found, the same UID, and not deleted before
// now less deletionLeeway. An error means the proxy could not tell.
func (b *boundObjects) holds(ctx context.Context, ref objectRef, uid string, now time.Time) (bool, error) {
	st, err := b.get(ctx, ref, now)
	if err != nil {
		return false, err
	}
	return st.found && st.uid == uid && (st.deleted.IsZero() || !st.deleted.Before(now.Add(-deletionLeeway))), nil
}
