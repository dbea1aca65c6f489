package store

import (
	"hash/maphash"
	"sync"
	"time"
)

// The location cache (Config.LocationCache) keeps where objects are, so
// a repeated get reads its replica without asking the master. An entry
// is used only while two things hold:
//   - its read lease has more than a quarter of its TTL left: the master
//     neither evicts a leased object nor removes it without force, and a
//     forced remove holds its space until the lease ends, so its memory
//     is the object's or nobody's for that time, as for any get;
//   - the client's invalidation subscription is fresh: the master's
//     invalidations (remove, forced or not, eviction, loss, a dropped
//     replica) drop the entry, and a remove answers only once they did.
//
// A get that fails from a cached entry (read error, lease) drops it and
// asks the master, once.

// locShards spreads the cache's locks.
const locShards = 32

type locCache struct {
	seed   maphash.Seed
	per    int // entries per shard
	shards [locShards]locShard
}

type locShard struct {
	mu sync.Mutex
	// epoch counts invalidations that touched the shard, so a master
	// answer that an invalidation may have overtaken is not cached.
	epoch uint64
	m     map[string]locEntry
}

type locEntry struct {
	loc   located
	useBy time.Time // the lease's deadline less a quarter of its TTL
}

func newLocCache(entries int) *locCache {
	lc := &locCache{seed: maphash.MakeSeed(), per: max(1, (entries+locShards-1)/locShards)}
	for i := range lc.shards {
		lc.shards[i].m = make(map[string]locEntry)
	}
	return lc
}

func (lc *locCache) shard(key string) *locShard {
	return &lc.shards[maphash.String(lc.seed, key)%locShards]
}

// get returns key's cached location if it may still be used at now.
func (lc *locCache) get(key string, now time.Time) (located, bool) {
	s := lc.shard(key)
	s.mu.Lock()
	e, ok := s.m[key]
	if ok && !now.Before(e.useBy) {
		delete(s.m, key)
		ok = false
	}
	s.mu.Unlock()
	return e.loc, ok
}

// epoch is key's shard epoch, read before asking the master.
func (lc *locCache) epoch(key string) uint64 {
	s := lc.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// put caches loc, asked for at start, unless an invalidation reached the
// shard since epoch was read. loc.reps must not change afterwards.
func (lc *locCache) put(key string, loc located, start time.Time, epoch uint64) {
	useBy := loc.deadline.Add(-loc.deadline.Sub(start) / 4)
	if !start.Before(useBy) {
		return
	}
	s := lc.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epoch != epoch {
		return
	}
	if _, ok := s.m[key]; !ok && len(s.m) >= lc.per {
		// Full: drop the entry the map's (random) order gives first.
		for k := range s.m {
			delete(s.m, k)
			break
		}
	}
	s.m[key] = locEntry{loc: loc, useBy: useBy}
}

// drop forgets key (its cached location failed a get).
func (lc *locCache) drop(key string) {
	s := lc.shard(key)
	s.mu.Lock()
	delete(s.m, key)
	s.mu.Unlock()
}

// Invalidate and InvalidateAll make locCache the InvalidationHandler of
// the client's own subscription.
func (lc *locCache) Invalidate(keys []string) {
	for _, k := range keys {
		s := lc.shard(k)
		s.mu.Lock()
		s.epoch++
		delete(s.m, k)
		s.mu.Unlock()
	}
}

func (lc *locCache) InvalidateAll() {
	lc.eachShard(func(s *locShard) {
		s.epoch++
		clear(s.m)
	})
}

// len counts the cached entries.
func (lc *locCache) len() int {
	n := 0
	lc.eachShard(func(s *locShard) { n += len(s.m) })
	return n
}

// eachShard runs f on every shard, under its lock.
func (lc *locCache) eachShard(f func(*locShard)) {
	for i := range lc.shards {
		s := &lc.shards[i]
		s.mu.Lock()
		f(s)
		s.mu.Unlock()
	}
}
