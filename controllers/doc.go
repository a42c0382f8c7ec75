// Package controllers turns WatchBudgets into the policy the proxy enforces
// and reports back on them. Its pieces, wired by SetupWithManager:
//
//   - PolicyReconciler (every replica, no leader election): reads every
//     WatchBudget from the cache, compiles the valid ones into one immutable
//     ratelimit.Policy and swaps it into the engine. The swap keeps every
//     identity's buckets, open watches and backoff; an invalid budget is
//     left out without disturbing the others.
//   - ReadyReconciler (leader only): sets each budget's Ready condition
//     (True/Compiled or False/InvalidSpec, with observedGeneration), the
//     status sums shown by `kubectl get wb` (activeWatches,
//     recentRejections), and the suggested limits (status.suggested, the
//     SUGGESTED column of `-o wide`), from the replicas' entries: it adds
//     up their sketches and those of replicas that are gone
//     (status.observedByGoneReplicas) and asks ratelimit.Suggest
//     (suggest.go).
//   - ReplicaStatusWriter (every replica): every 15 s, writes this replica's
//     live figures (active watches, tracked identities, decisions by reason,
//     top offenders, the sketch of its identities' observed peaks) into its
//     own entry of status.replicas, only when they changed — the
//     cumulative decision counts and the sketch's buckets alone at most
//     every 5 minutes, so a busy but steady budget costs no steady writes — with
//     server-side apply (typed apply configurations) and a field manager of
//     its own, so replicas never clobber each other. ReplicaPruner (leader only) removes
//     the entries of pods that are gone. A replica that stops removes its
//     own; either way the entry's sketch is added to
//     status.observedByGoneReplicas in the same JSON patch, so the
//     suggestion outlives the pods (suggest_gone.go).
//   - BootstrapReconciler (leader only, with --bootstrap-budgets): keeps an
//     install's default budgets in place as kube-apiserver keeps API
//     Priority and Fairness's bootstrap configuration: mandatory ones
//     restored, suggested ones kept up to date until an operator takes
//     them over (AutoUpdateAnnotation), with server-side apply.
//   - ShareReporter (every replica) and ShareAllocator (leader only), with
//     Options.Shares: the replicas share every budget. Each replica renews
//     its demand Lease (watchgate-demand-<pod>) with the engine's Demand
//     every 2 s; the leader reads the live ones and writes
//     ratelimit.Allocate's fractions to the Lease watchgate-shares; each
//     replica enforces its own (Engine.SetShares), and keeps them while
//     the leader or the API server is away (shares.go).
//   - ThrottleEvents (every replica): turns the engine's OnThrottled
//     callback, already limited to one call per budget × identity per
//     interval, into Events on the WatchBudget.
//
// Who writes what, and why no two writers conflict:
//
//	spec of the bootstrapped budgets (and their label and annotation)
//	                                                          field manager "watchgate-bootstrap" (leader)
//	status.conditions[Ready], activeWatches, recentRejections,
//	limits, suggested                                         field manager "watchgate-controller" (leader)
//	status.replicas[pod=P]                                    field manager "watchgate-replica-P" (replica P)
//	removing status.replicas[pod=P], adding to
//	status.observedByGoneReplicas                             replica P as it stops, or the pruner (JSON patch
//	                                                          testing what it read)
//	Lease watchgate-demand-P                                  replica P (update)
//	Lease watchgate-shares                                    the leader (update)
//
// Compile, ToBudget and the entry/sum helpers are pure and unit tested; the
// rest is tested against a real kube-apiserver.
package controllers
