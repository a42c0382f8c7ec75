package authn

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	metadatafake "k8s.io/client-go/metadata/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeObjects is a metadata client over objects (keyed resource/namespace/
// name) that counts its GETs.
type fakeObjects struct {
	mu      sync.Mutex
	objects map[string]metav1.ObjectMeta
	gets    atomic.Int64
	client  *metadatafake.FakeMetadataClient
}

func newFakeObjects() *fakeObjects {
	f := &fakeObjects{objects: map[string]metav1.ObjectMeta{}, client: metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme())}
	f.client.PrependReactor("get", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		f.gets.Add(1)
		g := a.(clienttesting.GetAction)
		f.mu.Lock()
		m, ok := f.objects[g.GetResource().Resource+"/"+g.GetNamespace()+"/"+g.GetName()]
		f.mu.Unlock()
		if !ok {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: g.GetResource().Resource}, g.GetName())
		}
		m.Name, m.Namespace = g.GetName(), g.GetNamespace()
		return true, &metav1.PartialObjectMetadata{ObjectMeta: m}, nil
	})
	return f
}

func (f *fakeObjects) set(key string, m *metav1.ObjectMeta) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m == nil {
		delete(f.objects, key)
		return
	}
	f.objects[key] = *m
}

func podMeta(name, uid string, deleted *time.Time) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: name, UID: types.UID(uid)}}
	if deleted != nil {
		m.DeletionTimestamp = &metav1.Time{Time: *deleted}
	}
	return m
}

// The watch's events correct what boundObjects remembers of the objects
// it looked up, as soon as they arrive (no clock step below), and only
// those: a timeline of one pod per case, each looked up first.
func TestWatchedEventsCorrectWhatIsRemembered(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	objs := newFakeObjects()
	b := NewBoundObjects(objs.client, 100, time.Minute, 10*time.Second, time.Second, nil, clk)
	ctx := context.Background()
	holds := func(name, uid string) bool {
		t.Helper()
		ok, err := b.holds(ctx, objectRef{resource: "pods", namespace: "agents", name: name}, uid, t0)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	lookedUp := func(name, uid string) {
		t.Helper()
		objs.set("pods/agents/"+name, &metav1.ObjectMeta{UID: types.UID(uid)})
		if !holds(name, uid) {
			t.Fatalf("pod %s not found", name)
		}
	}
	recently, longAgo := t0.Add(-10*time.Second), t0.Add(-2*time.Minute)

	for name, tc := range map[string]struct {
		event           watch.EventType
		meta            *metav1.PartialObjectMetadata
		now             *metav1.ObjectMeta // the pod the API server has after the event; nil: none
		oldUID, newUID  bool               // whether a token of uid-1, of uid-2 is vouched for after
		wantGETs        int64              // GETs to answer both
		wantDeletionsUp float64
	}{
		"deleted: refused at once, without a GET": {
			event: watch.Deleted, meta: podMeta("p", "uid-1", nil), now: nil, wantDeletionsUp: 1,
		},
		"deleted under another UID than the one looked up: the one looked up stays": {
			event: watch.Deleted, meta: podMeta("p", "uid-0", nil), now: &metav1.ObjectMeta{UID: "uid-1"}, oldUID: true,
		},
		"marked for deletion within kube-apiserver's leeway: still vouches": {
			event: watch.Modified, meta: podMeta("p", "uid-1", &recently), now: &metav1.ObjectMeta{UID: "uid-1"}, oldUID: true,
		},
		"marked for deletion longer ago than the leeway: refused without a GET": {
			event: watch.Modified, meta: podMeta("p", "uid-1", &longAgo), now: &metav1.ObjectMeta{UID: "uid-1"},
		},
		"re-created under the same name: looked up again, the old UID refused": {
			event: watch.Added, meta: podMeta("p", "uid-2", nil), now: &metav1.ObjectMeta{UID: "uid-2"}, newUID: true, wantGETs: 1, wantDeletionsUp: 1,
		},
		"modified, same UID: nothing changes": {
			event: watch.Modified, meta: podMeta("p", "uid-1", nil), now: &metav1.ObjectMeta{UID: "uid-1"}, oldUID: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			b.cache.RemoveAll(func(any) bool { return true })
			lookedUp("p", "uid-1")
			objs.set("pods/agents/p", tc.now)
			deletions := counterValue(t, boundObjectDeletions.WithLabelValues("pods"))
			gets := objs.gets.Load()
			b.observe("pods", tc.event, tc.meta)
			if got := holds("p", "uid-1"); got != tc.oldUID {
				t.Errorf("a token of uid-1 vouched for: %v, want %v", got, tc.oldUID)
			}
			if got := holds("p", "uid-2"); got != tc.newUID {
				t.Errorf("a token of uid-2 vouched for: %v, want %v", got, tc.newUID)
			}
			if n := objs.gets.Load() - gets; n != tc.wantGETs {
				t.Errorf("%d GETs, want %d", n, tc.wantGETs)
			}
			if n := counterValue(t, boundObjectDeletions.WithLabelValues("pods")) - deletions; n != tc.wantDeletionsUp {
				t.Errorf("deletions counted: %v, want %v", n, tc.wantDeletionsUp)
			}
		})
	}

	t.Run("a pod remembered as not found and created again is looked up again", func(t *testing.T) {
		objs.set("pods/agents/q", nil)
		if holds("q", "uid-q") {
			t.Fatal("a pod not there vouches")
		}
		objs.set("pods/agents/q", &metav1.ObjectMeta{UID: "uid-q"})
		b.observe("pods", watch.Added, podMeta("q", "uid-q", nil))
		if !holds("q", "uid-q") {
			t.Error("the pod created again does not vouch for its token: the not-found answer was kept")
		}
	})

	t.Run("events of objects never looked up are not remembered", func(t *testing.T) {
		for _, typ := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted} {
			b.observe("pods", typ, podMeta("stranger", "uid-s", nil))
		}
		if _, ok := b.cache.Get(objectRef{resource: "pods", namespace: "agents", name: "stranger"}); ok {
			t.Error("an event of an object not looked up added it")
		}
	})

	t.Run("a deletion seen while the pod's GET is in flight wins over the GET's older answer", func(t *testing.T) {
		inGet, release := make(chan struct{}), make(chan struct{})
		slow := metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme())
		slow.PrependReactor("get", "*", func(clienttesting.Action) (bool, runtime.Object, error) {
			close(inGet)
			<-release
			return true, podMeta("r", "uid-r", nil), nil // read before the deletion
		})
		b := NewBoundObjects(slow, 100, time.Minute, 10*time.Second, time.Minute, nil, clk)
		ref := objectRef{resource: "pods", namespace: "agents", name: "r"}
		done := make(chan bool)
		go func() {
			ok, _ := b.holds(ctx, ref, "uid-r", t0)
			done <- ok
		}()
		<-inGet
		b.observe("pods", watch.Deleted, podMeta("r", "uid-r", nil))
		close(release)
		if <-done {
			t.Error("the token vouched for by a GET answered before the deletion the watch saw")
		}
		if _, ok := b.cache.Get(ref); ok {
			t.Error("the GET's answer, older than the watch's event, was remembered")
		}
	})
}

// watchOpened is one watch the proxy opened: its resource, the
// resourceVersion it starts from, and the fake stream the test feeds.
type watchOpened struct {
	resource, rv string
	w            *watch.FakeWatcher
}

// fakeWatches makes objs's client answer LISTs with resourceVersion
// listRV (counting them per resource, or failing with listErr) and hand
// each WATCH to the test through the returned channel.
func fakeWatches(objs *fakeObjects, listRV string, listErr error) (<-chan watchOpened, *sync.Map) {
	opened := make(chan watchOpened, 16)
	lists := &sync.Map{}
	objs.client.PrependReactor("list", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		n, _ := lists.LoadOrStore(a.GetResource().Resource, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if listErr != nil {
			return true, nil, listErr
		}
		return true, &metav1.List{ListMeta: metav1.ListMeta{ResourceVersion: listRV}}, nil
	})
	objs.client.PrependWatchReactor("*", func(a clienttesting.Action) (bool, watch.Interface, error) {
		w := watch.NewFake()
		opened <- watchOpened{resource: a.GetResource().Resource, rv: a.(clienttesting.WatchAction).GetWatchRestrictions().ResourceVersion, w: w}
		return true, w, nil
	})
	return opened, lists
}

func listsOf(lists *sync.Map, resource string) int64 {
	n, ok := lists.Load(resource)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// next returns the next watch opened of resource, the others' left aside.
func next(t *testing.T, opened <-chan watchOpened, resource string) watchOpened {
	t.Helper()
	for {
		select {
		case o := <-opened:
			if o.resource == resource {
				return o
			}
		case <-time.After(time.Minute):
			t.Fatalf("no watch of %s opened", resource)
		}
	}
}

// Each watch starts from now (a LIST's resourceVersion), goes on from the
// last version seen (events and bookmarks) when it ends, and after a 410
// forgets the answers of its resource and starts from now again; it ends
// with its context, leaving no goroutine behind.
func TestBoundObjectWatchesResumeAndStartAgainAfterGone(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	objs := newFakeObjects()
	opened, lists := fakeWatches(objs, "100", nil)
	b := NewBoundObjects(objs.client, 100, time.Minute, 10*time.Second, time.Second, nil, clocktesting.NewFakeClock(t0))
	b.watchBackoff = wait.Backoff{Duration: time.Millisecond, Cap: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.watchDeletions(ctx, logr.Discard())
	}()
	defer func() {
		cancel()
		<-done
	}()

	pods := next(t, opened, "pods")
	if pods.rv != "100" || listsOf(lists, "pods") != 1 {
		t.Fatalf("the first watch of pods from %q after %d lists, want from the list's 100 after 1", pods.rv, listsOf(lists, "pods"))
	}
	objs.set("pods/agents/p", &metav1.ObjectMeta{UID: "uid-p"})
	ref := objectRef{resource: "pods", namespace: "agents", name: "p"}
	if ok, err := b.holds(context.Background(), ref, "uid-p", t0); !ok || err != nil {
		t.Fatalf("pod p: %v %v", ok, err)
	}

	other := podMeta("other", "uid-o", nil)
	other.ResourceVersion = "101"
	pods.w.Modify(other)
	pods.w.Action(watch.Bookmark, &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "105"}})
	pods.w.Stop() // the watch's timeout
	if again := next(t, opened, "pods"); again.rv != "105" || listsOf(lists, "pods") != 1 {
		t.Fatalf("after its timeout the watch went on from %q after %d lists, want from the bookmark's 105 without a list", again.rv, listsOf(lists, "pods"))
	} else {
		pods = again
	}
	if _, ok := b.cache.Get(ref); !ok {
		t.Fatal("a watch that ended after its timeout forgot what was looked up")
	}

	restarts := counterValue(t, boundObjectWatchRestarts.WithLabelValues("pods"))
	pods.w.Error(&apierrors.NewResourceExpired("too old resource version: 105 (200)").ErrStatus)
	if again := next(t, opened, "pods"); again.rv != "100" || listsOf(lists, "pods") != 2 {
		t.Fatalf("after 410 the watch started from %q after %d lists, want from a new list's 100", again.rv, listsOf(lists, "pods"))
	}
	if _, ok := b.cache.Get(ref); ok {
		t.Error("after 410 (events may have been missed) pod p's answer is still remembered")
	}
	if n := counterValue(t, boundObjectWatchRestarts.WithLabelValues("pods")) - restarts; n != 1 {
		t.Errorf("restarts counted: %v, want 1", n)
	}
}

// A proxy not allowed to watch (a ClusterRole with get only) says so
// once, keeps looking objects up (trusted MaxFoundTTL) and does not count
// restarts.
func TestBoundObjectWatchesForbidden(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	objs := newFakeObjects()
	_, lists := fakeWatches(objs, "", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", nil))
	b := NewBoundObjects(objs.client, 100, time.Minute, 10*time.Second, time.Second, nil, clocktesting.NewFakeClock(t0))
	var mu sync.Mutex
	var logs []string
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, args)
	}, funcr.Options{})
	restarts := 0.0
	for _, r := range boundResources {
		restarts += counterValue(t, boundObjectWatchRestarts.WithLabelValues(r))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.watchDeletions(ctx, log)
	}()
	deadline := time.Now().Add(time.Minute)
	for listsOf(lists, "pods") == 0 || listsOf(lists, "nodes") == 0 || listsOf(lists, "serviceaccounts") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("not every resource was listed")
		}
		time.Sleep(time.Millisecond)
	}
	objs.set("pods/agents/p", &metav1.ObjectMeta{UID: "uid-p"})
	if ok, err := b.holds(context.Background(), objectRef{resource: "pods", namespace: "agents", name: "p"}, "uid-p", t0); !ok || err != nil {
		t.Errorf("pod p looked up without a watch: %v %v", ok, err)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(logs) != 1 || !strings.Contains(logs[0], "Cannot watch") || !strings.Contains(logs[0], "MaxFoundTTL") {
		t.Errorf("logged %q, want one line saying the watch is forbidden and MaxFoundTTL applies", logs)
	}
	after := 0.0
	for _, r := range boundResources {
		after += counterValue(t, boundObjectWatchRestarts.WithLabelValues(r))
	}
	if after != restarts {
		t.Errorf("restarts counted while forbidden: %v", after-restarts)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
