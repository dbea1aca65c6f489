package alloc

import (
	"hash/maphash"
	"maps"
)

// cowShards is how many pieces a cowMap is cut into: a change copies one.
const cowShards = 64

// cowMap is a copy-on-write map in shards. A table version shares every
// shard with the version it was cloned from; the first write to a shard
// in a new version copies that shard alone, so a mount among N segments
// copies about N/64 entries per index instead of N. Published versions
// are never written, so readers need no lock.
type cowMap[K comparable, V any] struct {
	hash  func(K) uint64
	shard [cowShards]map[K]V
	owned uint64 // shards this version copied (writable)
	n     int
}

func newCowMap[K comparable, V any](hash func(K) uint64) cowMap[K, V] {
	return cowMap[K, V]{hash: hash}
}

func (m *cowMap[K, V]) at(k K) int { return int(m.hash(k) % cowShards) }

func (m *cowMap[K, V]) get(k K) (V, bool) {
	v, ok := m.shard[m.at(k)][k]
	return v, ok
}

func (m *cowMap[K, V]) len() int { return m.n }

// clone is a new version sharing every shard.
func (m *cowMap[K, V]) clone() cowMap[K, V] {
	c := *m
	c.owned = 0
	return c
}

// writable returns shard i of this version, copied on first use.
func (m *cowMap[K, V]) writable(i int) map[K]V {
	if m.owned&(1<<i) == 0 {
		m.shard[i] = maps.Clone(m.shard[i])
		if m.shard[i] == nil {
			m.shard[i] = map[K]V{}
		}
		m.owned |= 1 << i
	}
	return m.shard[i]
}

func (m *cowMap[K, V]) set(k K, v V) {
	s := m.writable(m.at(k))
	if _, ok := s[k]; !ok {
		m.n++
	}
	s[k] = v
}

func (m *cowMap[K, V]) del(k K) {
	i := m.at(k)
	if _, ok := m.shard[i][k]; !ok {
		return
	}
	delete(m.writable(i), k)
	m.n--
}

// The hashes are seeded per process: a peer choosing segment IDs or
// names cannot pile them into one shard.
var cowSeed = maphash.MakeSeed()

func hashUUID(u UUID) uint64 { return maphash.Comparable(cowSeed, u) }

func hashString(s string) uint64 { return maphash.String(cowSeed, s) }
