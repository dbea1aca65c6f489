package master

import (
	"hash/maphash"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/alloc"
)

// tshard is a shard alone with its own seed: get, insert and remove hash
// the key as Master.locate would.
type tshard struct {
	*shard
	seed maphash.Seed
}

func newTShard() tshard { return tshard{&shard{}, maphash.MakeSeed()} }

func (s tshard) get(k string) *object      { return s.shard.get(k, maphash.String(s.seed, k)) }
func (s tshard) insert(k string, o object) { s.shard.insert(k, maphash.String(s.seed, k), o) }
func (s tshard) remove(k string)           { s.shard.remove(k, maphash.String(s.seed, k)) }

// checkShard compares a shard with its model: every key found at its
// record, each visits exactly the model, the index holds one entry a key.
func checkShard(t *testing.T, sh tshard, model map[string]uint64) {
	t.Helper()
	require.Equal(t, len(model), sh.len())
	seen := map[string]bool{}
	sh.each(func(k string, o *object) bool {
		require.False(t, seen[k], "key %q twice", k)
		seen[k] = true
		require.Equal(t, model[k], o.size(), "key %q", k)
		require.Same(t, o, sh.get(k))
		return true
	})
	require.Len(t, seen, len(model))
	live := 0
	for _, e := range sh.tab {
		if e != 0 {
			live++
		}
	}
	require.Equal(t, len(model), live)
	require.Equal(t, sh.nslots, sh.len()+len(sh.free))
}

// TestShardModel drives one shard through random inserts and removes
// (both compactions, index growth, keys longer than an arena chunk) and
// checks it against a map after every round.
func TestShardModel(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	sh := newTShard()
	model := map[string]uint64{}
	var live []string
	key := func(i int) string {
		if i%97 == 0 {
			return strings.Repeat("long/", 1000) + strconv.Itoa(i) // beyond keyChunk
		}
		return "model/layer/block-" + strconv.Itoa(i)
	}
	next := 0
	var slabShrunk, arenaShrunk bool
	for round := range 40 {
		grow := round%8 < 4 // fill, then drain most of it
		for range 2000 {
			if grow || len(live) == 0 || r.IntN(10) == 0 {
				k := key(next)
				next++
				require.Nil(t, sh.get(k))
				sh.insert(k, newObject(uint64(next), 0, placementForTest(), 0))
				model[k] = uint64(next)
				live = append(live, k)
				continue
			}
			i := r.IntN(len(live))
			k := live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			sh.remove(k)
			delete(model, k)
			require.Nil(t, sh.get(k))
		}
		slots, used := sh.nslots, sh.keyUsed
		sh.mu.Lock()
		sh.unlock() // compacts when due
		slabShrunk = slabShrunk || sh.nslots < slots
		arenaShrunk = arenaShrunk || sh.keyUsed < used
		checkShard(t, sh, model)
	}
	require.True(t, slabShrunk && arenaShrunk, "no compaction ran")
	// Removing during each, as the release and unmount walks do.
	sh.each(func(k string, o *object) bool {
		if o.size()%2 == 0 {
			sh.remove(k)
			delete(model, k)
		}
		return true
	})
	checkShard(t, sh, model)
	for k := range model {
		sh.remove(k)
	}
	sh.mu.Lock()
	sh.unlock()
	require.Zero(t, sh.nslots)
	require.Nil(t, sh.keys)
	require.Nil(t, sh.tab)
}

// TestShardTagCollisions: with 300,000 keys in one shard some share the
// 32-bit tag; each is still found by its own bytes.
func TestShardTagCollisions(t *testing.T) {
	sh := newTShard()
	const n = 300_000
	tags := map[uint64]int{}
	shared := 0
	for i := range n {
		k := blockKey(nil, i)
		if tags[maphash.String(sh.seed, k)>>32]++; tags[maphash.String(sh.seed, k)>>32] == 2 {
			shared++
		}
		sh.insert(k, newObject(uint64(i+1), 0, placementForTest(), 0))
	}
	t.Logf("%d tags shared", shared)
	for i := range n {
		o := sh.get(blockKey(nil, i))
		require.NotNil(t, o)
		require.Equal(t, uint64(i+1), o.size())
	}
	require.Nil(t, sh.get(blockKey(nil, n)))
	for i := 0; i < n; i += 2 {
		sh.remove(blockKey(nil, i))
	}
	for i := range n {
		if o := sh.get(blockKey(nil, i)); i%2 == 0 {
			require.Nil(t, o)
		} else {
			require.Equal(t, uint64(i+1), o.size())
		}
	}
}

func placementForTest() alloc.Placement { return alloc.Placement{Addr: 1 << 20} }

// TestLocateOneHash: the one hash locate gives picks the shard that holds
// the key and finds it there (the index tag is its high half), for keys
// put through the Master; in any other shard, or with another hash, the
// key is not found.
func TestLocateOneHash(t *testing.T) {
	e := newEnv(t, nil)
	c := cl(1)
	e.mount(c, "seg", 64<<20)
	const n = 2000
	for i := range n {
		e.put(c, blockKey(nil, i), 4096, ReplicateConfig{Replicas: 1})
	}
	m := e.m
	for i := range n {
		k := blockKey(nil, i)
		sh, h := m.locate(k)
		require.Equal(t, maphash.String(m.seed, k), h)
		require.Equal(t, m.hash(k), h)
		require.Same(t, &m.shards[h%uint64(len(m.shards))], sh)
		sh.mu.Lock()
		o := sh.get(k, h)
		wrong := sh.get(k, h^1<<40) // another tag
		sh.mu.Unlock()
		require.NotNil(t, o, "key %q not in the shard locate picked", k)
		require.Nil(t, wrong)
		for j := range m.shards {
			if other := &m.shards[j]; other != sh {
				other.mu.Lock()
				require.Nil(t, other.get(k, h), "key %q in shard %d too", k, j)
				other.mu.Unlock()
			}
		}
	}
	checkInvariants(t, m)
}
