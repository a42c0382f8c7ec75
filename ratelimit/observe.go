package ratelimit

import (
	"time"
	"unsafe"
)

// observation is what one identity did under its budget, as peaks: the
// most watch opens in a calendar minute (UTC) and in a calendar second, the
// most watches open at once, the most lists, the most stale-version
// answers and the most watches refused for backoff in a calendar minute. It is fixed-size (observationBytes), kept
// in the identity and evicted with it (folded first into its budget's
// retired peaks), and records requests as asked — in Enforce, rejected ones
// too, since they show what the identity wanted. Its fields are guarded by
// the identity's shard lock.
type observation struct {
	// minute and second are the calendar minute and second (Unix time
	// divided by their length) the counts below are of.
	minute, second int64
	// opens, lists, stale, backoffs count the current minute; secondOpens
	// the current second.
	opens, lists, stale, backoffs, secondOpens int32
	peak                                       peaks
}

// peaks are an identity's observed peaks, one per quantity.
type peaks struct {
	opensPerMinute, burst, concurrent, listsPerMinute, stalePerMinute, backoffPerMinute int32
}

// observationBytes is the size of an observation, part of an identity's.
const observationBytes = int(unsafe.Sizeof(observation{}))

// at moves the counts to the minute and second of now (UnixNano), starting
// them over when either moved on. Instants slightly out of order count in
// the current window.
func (o *observation) at(now int64) {
	if m := now / int64(time.Minute); m > o.minute {
		o.minute, o.opens, o.lists, o.stale, o.backoffs = m, 0, 0, 0, 0
	}
	if s := now / int64(time.Second); s > o.second {
		o.second, o.secondOpens = s, 0
	}
}

// watchOpened records a watch asked for at now (UnixNano), stale answers
// aside.
func (o *observation) watchOpened(now int64) {
	o.at(now)
	o.opens = addSat(o.opens)
	o.secondOpens = addSat(o.secondOpens)
	o.peak.opensPerMinute = max(o.peak.opensPerMinute, o.opens)
	o.peak.burst = max(o.peak.burst, o.secondOpens)
}

// listed records a list asked for at now (UnixNano).
func (o *observation) listed(now int64) {
	o.at(now)
	o.lists = addSat(o.lists)
	o.peak.listsPerMinute = max(o.peak.listsPerMinute, o.lists)
}

// staleAnswered records a watch answered "too old" locally at now
// (UnixNano): one turn of a stale loop.
func (o *observation) staleAnswered(now int64) {
	o.at(now)
	o.stale = addSat(o.stale)
	o.peak.stalePerMinute = max(o.peak.stalePerMinute, o.stale)
}

// backedOff records a watch refused (or, in DryRun, that would have been)
// for backoff at now (UnixNano); it was counted as asked as well.
func (o *observation) backedOff(now int64) {
	o.at(now)
	o.backoffs = addSat(o.backoffs)
	o.peak.backoffPerMinute = max(o.peak.backoffPerMinute, o.backoffs)
}

// concurrent records n watches open at once (or wanted: an admitted one
// and the one refused for too many).
func (o *observation) concurrent(n int32) {
	o.peak.concurrent = max(o.peak.concurrent, n)
}

func addSat(n int32) int32 {
	if n == 1<<31-1 {
		return n
	}
	return n + 1
}

// ObservedPeaks sketch, for one budget, the peaks of the identities it
// governed (see PeakSketch): per identity, the most watch opens in a
// calendar minute (UTC) and in a calendar second, the most watches open at
// once, the most lists, the most watches answered "too old" locally and
// the most watches refused for backoff in a calendar minute. Requests are counted as asked: in DryRun that is all
// the identity did; in Enforce rejected requests count too, and a rejected
// client's retries with them. Each identity counts once per sketch, with a
// peak of 0 in what it never did; an identity evicted when idle and seen
// again later counts again. Exempt budgets and the identities over
// Options.MaxTrackedKeys (which share one overflow identity) are not
// observed.
//
// It costs a budget 6·PeakSketchBytes = 5760 bytes in the engine (its
// evicted identities' peaks) and an identity observationBytes = 64 bytes
// (TestObservationSize). Sketches of several replicas Merge.
type ObservedPeaks struct {
	// Since is when the engine started observing the budget; zero for an
	// empty sketch.
	Since time.Time
	// Identities is the number of identities observed, each counted in
	// every sketch below.
	Identities int64
	// WatchOpensPerMinute, WatchBurst (opens within a second),
	// ConcurrentWatches, ListsPerMinute, StaleAnswersPerMinute and
	// BackoffRefusalsPerMinute sketch the identities' peaks.
	WatchOpensPerMinute, WatchBurst, ConcurrentWatches, ListsPerMinute, StaleAnswersPerMinute, BackoffRefusalsPerMinute PeakSketch
}

// add counts one identity with peaks p.
func (op *ObservedPeaks) add(p *peaks) {
	op.Identities++
	op.WatchOpensPerMinute.Add(int64(p.opensPerMinute))
	op.WatchBurst.Add(int64(p.burst))
	op.ConcurrentWatches.Add(int64(p.concurrent))
	op.ListsPerMinute.Add(int64(p.listsPerMinute))
	op.StaleAnswersPerMinute.Add(int64(p.stalePerMinute))
	op.BackoffRefusalsPerMinute.Add(int64(p.backoffPerMinute))
}

// Merge adds o's identities to op; Since becomes the earlier of the two
// (a zero one ignored).
func (op *ObservedPeaks) Merge(o *ObservedPeaks) {
	if op.Since.IsZero() || (!o.Since.IsZero() && o.Since.Before(op.Since)) {
		op.Since = o.Since
	}
	op.Identities += o.Identities
	op.WatchOpensPerMinute.Merge(&o.WatchOpensPerMinute)
	op.WatchBurst.Merge(&o.WatchBurst)
	op.ConcurrentWatches.Merge(&o.ConcurrentWatches)
	op.ListsPerMinute.Merge(&o.ListsPerMinute)
	op.StaleAnswersPerMinute.Merge(&o.StaleAnswersPerMinute)
	op.BackoffRefusalsPerMinute.Merge(&o.BackoffRefusalsPerMinute)
}

// observes reports whether id's requests are observed: not the overflow
// identity, which stands for many.
func (id *identity) observes() bool { return id != id.sh.spill }

// observe records r, decided at now (UnixNano) with verdict v, in id's
// observation (stale: r was answered "too old" locally). id.sh.mu is held.
func (e *Engine) observe(id *identity, now int64, r *Request, stale bool, v verdict) {
	o := &id.obs
	switch {
	case stale:
		o.staleAnswered(now)
	case r.Verb == VerbWatch:
		o.watchOpened(now)
	case r.Verb == VerbList:
		o.listed(now)
	}
	if v.reason == ReasonBackingOff {
		o.backedOff(now)
	}
	switch {
	case v.admitted: // in DryRun, stale ones too: they are forwarded
		o.concurrent(id.open)
	case v.reason == ReasonTooManyWatches:
		o.concurrent(id.open + 1)
	}
}

// observed is bs's observed peaks: those of the identities it tracks and
// of those it evicted. It takes each shard's lock in turn.
func (bs *budgetState) observed() ObservedPeaks {
	bs.retiredMu.Lock()
	op := bs.retired
	bs.retiredMu.Unlock()
	for i := range bs.shards {
		sh := &bs.shards[i]
		sh.mu.Lock()
		sh.each(func(id *identity) { op.add(&id.obs.peak) })
		sh.mu.Unlock()
	}
	return op
}

// retire folds the peaks of identities about to be evicted into bs's.
func (bs *budgetState) retire(evicted *ObservedPeaks) {
	if evicted.Identities == 0 {
		return
	}
	bs.retiredMu.Lock()
	bs.retired.Merge(evicted)
	bs.retiredMu.Unlock()
}
