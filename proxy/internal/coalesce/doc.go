// Package coalesce is request coalescing with hand-over for watches from
// one explicit resourceVersion: the first (the Leader) goes on and asks the
// API server; the others that come while its verdict is unknown wait
// (bounded, fair per caller), then are decided again, so that a storm on
// one stale version costs one upstream WATCH. A leader that learns nothing
// hands over to the follower that has waited longest (see proxy's doc for
// the states).
//
// It decides nothing itself: proxy's admission filter calls Coalesce
// before the engine, and the relay tells the Leader what the stream
// taught (Settle, HandOver, ObserveStale).
package coalesce
