package ratelimit

import (
	"encoding/binary"
	"hash/fnv"
	"hash/maphash"
)

// requestKey is a watch's key as the client sent it: what backoff is kept
// per, besides the identity. Its strings are the client's and of any size;
// the engine never stores them, only their watchKey.
type requestKey struct {
	group, resource, namespace, labelSelector, fieldSelector string
}

func requestKeyOf(r *Request) requestKey {
	return requestKey{r.Group, r.Resource, r.Namespace, r.LabelSelector, r.FieldSelector}
}

// watchKey is a fixed-size stand-in for a requestKey: 128 bits of two
// maphash sums under the engine's two secret seeds, so a backoff key takes
// 16 bytes whatever the client sent. Keys are compared only within one
// identity, which tracks at most Options.MaxBackoffKeysPerIdentity of them:
// with 64, the chance that two of one identity's keys collide is about
// 64²/2¹²⁹ ≈ 10⁻³⁵, and since the seeds are secret and per engine, a client
// cannot aim for a collision (which would only merge two of its own keys'
// backoff anyway).
type watchKey struct{ hi, lo uint64 }

// overflowKey and staleOverflowKey are the keys under which an identity
// keeps the backoff of the watch keys beyond its own cap: the failures of
// forwarded watches, and the stale answers given locally (see backoff.go).
// watchKeyOf never returns them (lo is odd there).
var (
	overflowKey      = watchKey{}
	staleOverflowKey = watchKey{lo: 2}
)

// keySeeds are the engine's secret seeds for watchKeyOf.
type keySeeds [2]maphash.Seed

func newKeySeeds() keySeeds { return keySeeds{maphash.MakeSeed(), maphash.MakeSeed()} }

func (s *keySeeds) watchKeyOf(k *requestKey) watchKey {
	return watchKey{hi: hashKey(s[0], k), lo: hashKey(s[1], k) | 1}
}

// hashKey hashes k's fields, each preceded by its length so that no two
// distinct keys feed the same bytes.
func hashKey(seed maphash.Seed, k *requestKey) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	var n [8]byte
	for _, s := range [...]string{k.group, k.resource, k.namespace, k.labelSelector, k.fieldSelector} {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.WriteString(s)
	}
	return h.Sum64()
}

// jitterPrefix bounds how much of each string the jitter input reads.
const jitterPrefix = 256

// jitterInput is a deterministic digest of user and k for backoff jitter:
// unlike watchKey it does not depend on the engine's random seeds, so
// jitter is reproducible under Options.Seed. It reads at most jitterPrefix
// bytes of each string (and every length), so a huge selector costs no
// more to digest than a short one.
func jitterInput(user string, k *requestKey) uint64 {
	h := fnv.New64a()
	var n [8]byte
	for _, s := range [...]string{user, k.group, k.resource, k.namespace, k.labelSelector, k.fieldSelector} {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s[:min(len(s), jitterPrefix)]))
	}
	return h.Sum64()
}
