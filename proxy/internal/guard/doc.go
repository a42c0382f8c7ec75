// Package guard shares this replica's watches over a tree of flows
// (Flow: tenants — a namespace's service accounts together, any other
// caller alone —, their callers, the users an impersonating caller acts
// as): Guard admits a watch its budget already admitted only while the
// replica can afford it (503 above the memory high-water mark of
// GOMEMLIMIT, read from the runtime, MemoryReader), 429 at the replica's
// cap (MaxWatches), at the cap per tenant, at a quarter of it per
// impersonated user, and near each beyond a fair share, max-min.
// Streams accounts per authenticated caller the bytes its watches and
// lists hold buffered, refuses a caller at its share of them or at its
// lists in flight (Guard.AdmitList), turns the memory mark on the callers
// holding the most only, and cuts streams whose client stopped reading
// (Sweep). A new reason to refuse a watch for the replica's sake is added
// here; reasons of a budget belong to ratelimit, and the order of the
// checks to proxy's admission.
//
// It also says what the caps default to for the memory a process runs
// under (ProcessMemoryLimit, MaxWatchesFor). It does not know budgets or
// callers' identities beyond their names. proxy's admission filter asks it
// after the engine.
package guard
