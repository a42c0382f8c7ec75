package authn

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// boundResources are the resources whose objects tokens are bound to, as
// boundObjects looks them up.
var boundResources = [...]string{"serviceaccounts", "pods", "nodes"}

const (
	// deletionWatchBackoffReset: a watch that lasted this long before it
	// failed starts again after the first delay, as a Reflector's does.
	deletionWatchBackoffReset = 2 * time.Minute
	// forbiddenWatchRetry is how often a watch the proxy may not open is
	// tried again (one LIST of one object), so that a permission granted
	// later is used without a restart.
	forbiddenWatchRetry = 5 * time.Minute
	// watchEndedAtOnce: a watch that ends sooner without an event or an
	// error is taken for a failure, so that a server that closes watches
	// at once is not asked again in a loop.
	watchEndedAtOnce = time.Second
)

var errWatchEndedAtOnce = errors.New("the watch ended at once")

// watchDeletions watches service accounts, pods and nodes, cluster-wide,
// metadata only, until ctx ends, and applies each event to what b
// remembers (observe), so that a token whose object is deleted is refused
// as soon as the deletion arrives. It keeps no object and nothing per
// event: per resource, only the last resourceVersion seen.
//
// Each watch starts from now (the resourceVersion of a LIST of one
// object) and, after its timeout (5–10 minutes, spread as a Reflector
// spreads its watches), goes on from the last resourceVersion seen, with
// bookmarks. When it fails (an error, 410 Gone: events may have been
// missed) every answer b remembers for the resource is dropped, so that
// the next request looks again, and the watch starts from now after a
// delay (watchBackoff). A watch the proxy may not open (RBAC without list
// and watch) is logged once and tried again every forbiddenWatchRetry;
// meanwhile answers are trusted for at most MaxFoundTTL, as always.
func (b *boundObjects) watchDeletions(ctx context.Context, log logr.Logger) {
	var wg sync.WaitGroup
	var forbidden sync.Once
	for _, r := range boundResources {
		wg.Go(func() { b.watchResource(ctx, r, log.WithValues("resource", r), &forbidden) })
	}
	wg.Wait()
}

// watchResource watches resource until ctx ends, starting again from now
// after each failure; a watch not allowed is logged once for the three
// resources (forbidden).
func (b *boundObjects) watchResource(ctx context.Context, resource string, log logr.Logger, forbidden *sync.Once) {
	backoff := b.watchBackoff
	for {
		started := time.Now()
		err := b.watchFromNow(ctx, resource)
		if ctx.Err() != nil {
			return
		}
		b.forget(resource)
		var delay time.Duration
		if apierrors.IsForbidden(err) {
			forbidden.Do(func() {
				log.Info("Cannot watch the objects service-account tokens are bound to: a token whose object is deleted is refused "+
					"once watchgate's answer for the object expires (MaxFoundTTL, 10s); grant list and watch on serviceaccounts, pods and nodes",
					"err", err.Error())
			})
			delay = forbiddenWatchRetry
		} else {
			boundObjectWatchRestarts.WithLabelValues(resource).Inc()
			if time.Since(started) >= deletionWatchBackoffReset {
				backoff = b.watchBackoff
			}
			delay = backoff.Step()
			log.V(1).Info("Watching again from now", "err", err.Error(), "delay", delay.String())
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// watchFromNow lists one object of resource for the collection's
// resourceVersion, then watches from it, again from the last version seen
// after each watch's timeout, until ctx ends or a watch fails.
func (b *boundObjects) watchFromNow(ctx context.Context, resource string) error {
	client := b.client.Resource(schema.GroupVersionResource{Version: "v1", Resource: resource})
	list, err := client.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return fmt.Errorf("list %s: %w", resource, err)
	}
	// An answer remembered from before the list may be of an object
	// deleted before the version the watch starts from.
	b.forget(resource)
	rv := list.ResourceVersion
	for ctx.Err() == nil {
		timeout := int64(300 + rand.IntN(300)) // as a Reflector spreads its watches
		opened := time.Now()
		w, err := client.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout})
		if err != nil {
			return fmt.Errorf("watch %s from %s: %w", resource, rv, err)
		}
		next, err := b.drain(ctx, resource, w, rv)
		w.Stop()
		switch {
		case err != nil:
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		case next == rv && time.Since(opened) < watchEndedAtOnce:
			return fmt.Errorf("watch %s from %s: %w", resource, rv, errWatchEndedAtOnce)
		}
		rv = next
	}
	return ctx.Err()
}

// drain applies one watch's events until it ends or ctx does, and
// returns the last resourceVersion it saw (rv if none); an ERROR event
// (410 Gone among them) is an error.
func (b *boundObjects) drain(ctx context.Context, resource string, w watch.Interface, rv string) (string, error) {
	for {
		var ev watch.Event
		var open bool
		select {
		case <-ctx.Done():
			return rv, nil
		case ev, open = <-w.ResultChan():
		}
		if !open {
			return rv, nil
		}
		if ev.Type == watch.Error {
			return rv, fmt.Errorf("watch %s from %s: %w", resource, rv, apierrors.FromObject(ev.Object))
		}
		m, ok := ev.Object.(*metav1.PartialObjectMetadata)
		if !ok {
			continue
		}
		rv = m.ResourceVersion
		if ev.Type != watch.Bookmark {
			b.observe(resource, ev.Type, m)
		}
	}
}

// observe applies one event of resource's watch. Only an object b
// remembers, or one whose GET is in flight, can change; any other costs a
// map lookup:
//   - deleted, with the UID remembered: not found from now on (for
//     negativeTTL), so its tokens are refused;
//   - marked for deletion, with the UID remembered: its deletion time is
//     remembered (holds applies kube-apiserver's leeway);
//   - there under another UID (re-created under the same name), or there
//     while remembered as not found: forgotten, so that the next request
//     looks again, and the old UID's tokens are not vouched for.
//
// A GET in flight of the object is marked (see lookup): its answer may be
// older than the event.
func (b *boundObjects) observe(resource string, typ watch.EventType, m *metav1.PartialObjectMetadata) {
	ref := objectRef{resource: resource, namespace: m.Namespace, name: m.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	if f, ok := b.inflight[ref]; ok && (typ != watch.Modified || m.DeletionTimestamp != nil) {
		f.changed = true
		if typ == watch.Deleted {
			f.deletedUID = string(m.UID)
		}
	}
	v, ok := b.cache.Get(ref)
	if !ok {
		return
	}
	st := v.(objectState)
	uid := string(m.UID)
	switch {
	case typ == watch.Deleted:
		if st.found && st.uid == uid {
			b.cache.Add(ref, objectState{}, b.negativeTTL)
			b.found.Remove(ref)
			boundObjectDeletions.WithLabelValues(resource).Inc()
		}
	case !st.found || st.uid != uid:
		b.cache.Remove(ref)
		if st.found {
			boundObjectDeletions.WithLabelValues(resource).Inc()
		}
	case m.DeletionTimestamp != nil && st.deleted.IsZero():
		b.cache.Add(ref, stateOf(m), b.ttl)
	}
}

// forget drops every answer remembered for resource, found or not, and
// marks its GETs in flight, whose answers may be older than what a new
// watch starts from: the next request looks again (without spending
// budget for an object found before, see get).
func (b *boundObjects) forget(resource string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cache.RemoveAll(func(key any) bool { return key.(objectRef).resource == resource })
	for ref, f := range b.inflight {
		if ref.resource == resource {
			f.changed = true
		}
	}
}
