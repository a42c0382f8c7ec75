package ratelimit

import (
	"maps"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxStaleVersions caps the versions the stale memory holds, over all
	// resources. At the cap a new version is not remembered on its own
	// (its resource's watermark still rises): in Exact mode the watch that
	// asks for it goes to the API server, which answers 410 itself (fail
	// open, correct, just not saved).
	maxStaleVersions = 1 << 16
	// maxStaleResources caps the (group, resource) pairs it holds.
	maxStaleResources = 1 << 12
	// maxGroupBytes and maxResourceBytes bound the names it keeps: an API
	// group is a DNS subdomain, a resource a DNS label; a report naming
	// anything longer is not remembered.
	maxGroupBytes    = 253
	maxResourceBytes = 63
)

// staleMemory remembers the resourceVersions the API server declared too
// old, per (group, resource): each version reported (parsed, see
// parseVersion; never the string as sent) with when it was last reported,
// and the highest one with its report time, the watermark. How long a
// report counts is each budget's StaleVersions.Memory, and what it makes
// stale its StaleVersions.Match; Sweep forgets reports older than the
// longest Memory in the policy.
//
// Lookups take no lock while no version is remembered, and, in
// StaleMatchAtOrBelow, none when the watermark answers.
type staleMemory struct {
	versions, resources keyCap
	// highest is at least every resource's watermark: a version above it
	// is stale nowhere. kube-apiserver's versions are etcd revisions, one
	// counter for all resources, so a healthy watch's version is almost
	// always above every stale one, and is answered without a map lookup.
	highest atomic.Uint64
	// mu serialises changes to index.
	mu sync.Mutex
	// index is replaced, never modified: a lookup needs no lock.
	index atomic.Pointer[map[resourceName]*staleResource]
}

type resourceName struct{ group, resource string }

// staleResource is what the memory holds for one (group, resource).
type staleResource struct {
	mu sync.RWMutex
	// reportedAt is when each version was last reported too old, UnixNano.
	reportedAt map[uint64]int64 // guarded by mu
	// n is len(reportedAt), readable without the lock.
	n atomic.Int32
	// top is the watermark: the highest version reported and when it was
	// last reported. Replaced under mu, never modified; nil when none.
	top atomic.Pointer[watermark]
	// removed is set when Sweep drops the resource from the index.
	removed bool // guarded by mu
}

type watermark struct {
	version uint64
	at      int64 // UnixNano
}

func (m *staleMemory) init() {
	m.versions.max = maxStaleVersions
	m.resources.max = maxStaleResources
	m.index.Store(&map[resourceName]*staleResource{})
}

// parseVersion parses rv as kube-apiserver does
// (storage.APIObjectVersioner.ParseResourceVersion: strconv.ParseUint,
// base 10, 64 bits; FuzzParseVersion holds it to that), so "000…01" is 1,
// and reports whether it is an explicit version that can be too old: not
// "", "0" (or any spelling of 0), nor anything that does not parse, which
// the API server refuses itself. It skips leading zeros and reads at most
// 20 digits, so a huge rv costs a scan, never a copy.
func parseVersion(rv string) (uint64, bool) {
	z := 0
	for z < len(rv) && rv[z] == '0' {
		z++
	}
	digits := rv[z:]
	if digits == "" || len(digits) > 20 {
		return 0, false
	}
	var v uint64
	if len(digits) < 20 { // at most 19 digits: below 10¹⁹ < 2⁶⁴, cannot overflow
		for i := 0; i < len(digits); i++ {
			d := uint64(digits[i] - '0')
			if d > 9 {
				return 0, false
			}
			v = v*10 + d
		}
		return v, true
	}
	for i := 0; i < len(digits); i++ {
		d := uint64(digits[i] - '0')
		if d > 9 || v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// StaleVersionSeen tells the engine that the API server answered a watch
// on group/resource at resourceVersion with 410 Expired ("too old resource
// version"). For each budget's StaleVersions.Memory after now, a watch
// governed by a budget with StaleReject that asks for that version — or,
// with StaleMatchAtOrBelow, any version at or below it — is rejected with
// ReasonStaleResourceVersion without reaching the server. A version that
// is not explicit (see parseVersion) is ignored.
func (e *Engine) StaleVersionSeen(now time.Time, group, resource, resourceVersion string) {
	v, ok := parseVersion(resourceVersion)
	if !ok || len(group) > maxGroupBytes || len(resource) > maxResourceBytes {
		return
	}
	ns := now.UnixNano()
	for {
		res := e.stale.resource(group, resource)
		if res == nil {
			return // at the cap
		}
		res.mu.Lock()
		if !res.removed {
			res.report(&e.stale.versions, v, ns)
			e.stale.raise(v)
			res.mu.Unlock()
			return
		}
		res.mu.Unlock() // swept meanwhile: look it up again
	}
}

// report records v reported at ns. res.mu is held.
func (res *staleResource) report(versions *keyCap, v uint64, ns int64) {
	if at, ok := res.reportedAt[v]; ok {
		res.reportedAt[v] = max(at, ns)
	} else if versions.take() {
		res.reportedAt[v] = ns
		res.n.Add(1)
	}
	if top := res.top.Load(); top == nil || v > top.version || v == top.version && ns > top.at {
		res.top.Store(&watermark{v, ns})
	}
}

// raise makes highest at least v.
func (m *staleMemory) raise(v uint64) {
	for {
		h := m.highest.Load()
		if v <= h || m.highest.CompareAndSwap(h, v) {
			return
		}
	}
}

// resource returns the state of group/resource, creating it if needed;
// nil at the cap.
func (m *staleMemory) resource(group, resource string) *staleResource {
	k := resourceName{group, resource}
	if res := (*m.index.Load())[k]; res != nil {
		return res
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	index := *m.index.Load()
	if res := index[k]; res != nil {
		return res
	}
	if !m.resources.take() {
		return nil
	}
	next := make(map[resourceName]*staleResource, len(index)+1)
	maps.Copy(next, index)
	res := &staleResource{reportedAt: make(map[uint64]int64)}
	next[resourceName{strings.Clone(group), strings.Clone(resource)}] = res
	m.index.Store(&next)
	return res
}

// has reports whether rv of group/resource is stale at now under sv: a
// report that makes it stale (the version itself, or with
// StaleMatchAtOrBelow one at or above it) is younger than sv.Memory.
func (m *staleMemory) has(now time.Time, group, resource, rv string, sv *StaleVersions) bool {
	if sv.Memory <= 0 || m.resources.count() == 0 {
		return false
	}
	v, ok := parseVersion(rv)
	if !ok || v > m.highest.Load() {
		return false
	}
	res := (*m.index.Load())[resourceName{group, resource}]
	if res == nil {
		return false
	}
	ns := now.UnixNano()
	fresh := func(at int64) bool { return ns-at < int64(sv.Memory) }
	if sv.Match == StaleMatchExact {
		if res.n.Load() == 0 {
			return false
		}
		res.mu.RLock()
		at, ok := res.reportedAt[v]
		res.mu.RUnlock()
		return ok && fresh(at)
	}
	top := res.top.Load()
	if top == nil || v > top.version {
		return false
	}
	if fresh(top.at) {
		return true
	}
	// The watermark's report is too old for this budget; another report
	// at or above v may not be.
	res.mu.RLock()
	defer res.mu.RUnlock()
	for reported, at := range res.reportedAt {
		if reported >= v && fresh(at) {
			return true
		}
	}
	return false
}

// sweep forgets reports made at least memory before now, and resources
// left with none, and returns how many versions and resources it forgot.
func (m *staleMemory) sweep(now time.Time, memory time.Duration) (evicted int) {
	ns := now.UnixNano()
	was := m.highest.Load()
	var highest uint64
	var empty []resourceName
	for name, res := range *m.index.Load() {
		res.mu.Lock()
		n := 0
		for v, at := range res.reportedAt {
			if ns-at >= int64(memory) {
				delete(res.reportedAt, v)
				n++
			}
		}
		res.n.Add(int32(-n))
		m.versions.give(n)
		evicted += n
		if top := res.top.Load(); top != nil && ns-top.at >= int64(memory) {
			res.top.Store(res.highest())
		}
		if top := res.top.Load(); top == nil {
			empty = append(empty, name)
		} else {
			highest = max(highest, top.version)
		}
		res.mu.Unlock()
	}
	// Lower highest to what is left, unless a report raised it meanwhile.
	// (A report below the old highest that races this sweep may be lost
	// to the filter: its watch then goes to the API server, which answers
	// 410 and reports it again — fail open.)
	m.highest.CompareAndSwap(was, highest)
	if len(empty) == 0 {
		return evicted
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	next := maps.Clone(*m.index.Load())
	for _, name := range empty {
		res := next[name]
		res.mu.Lock()
		if res.top.Load() == nil { // no report came meanwhile
			res.removed = true
			delete(next, name)
			m.resources.give(1)
			evicted++
		}
		res.mu.Unlock()
	}
	m.index.Store(&next)
	return evicted
}

// highest is the watermark of the versions held, nil when none. res.mu is
// held.
func (res *staleResource) highest() *watermark {
	var top *watermark
	for v, at := range res.reportedAt {
		if top == nil || v > top.version {
			top = &watermark{v, at}
		}
	}
	return top
}
