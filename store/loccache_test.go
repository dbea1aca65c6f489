package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
)

// locateCalls counts the client's calls that ask the master where keys are.
func locateCalls(c *Client) uint64 {
	st := c.Stats()
	return st.RPC["GetReplicaList"].Calls + st.RPC["BatchGetReplicaList"].Calls
}

func withLocationCache(n int) func(*Config) { return func(c *Config) { c.LocationCache = n } }

// locRig starts a master (cfg), a writer a and a reader b with the
// location cache, fresh.
func locRig(t *testing.T, cfg master.Config) (tm *testMaster, a, b *Client) {
	tm = startMaster(t, cfg)
	a = newTestClient(t, tm, 16<<20, twoRPCPuts)
	b = newTestClient(t, tm, 16<<20, withLocationCache(1024))
	freshLocCache(t, b)
	return tm, a, b
}

// freshLocCache waits until c's location cache may be used.
func freshLocCache(t *testing.T, c *Client) {
	t.Helper()
	require.NotNil(t, c.locWatch)
	require.NoError(t, c.locWatch.WaitFresh(tctx(t)))
}

// TestLocationCacheSkipsMaster: a repeated get of a key, single or in a
// batch, reads its replica without asking the master; a client without
// the cache asks every time.
func TestLocationCacheSkipsMaster(t *testing.T) {
	_, a, b := locRig(t, master.Config{})
	ctx := tctx(t)
	v1, v2 := testutil.Bytes(50000, 1), testutil.Bytes(4096, 2)
	require.NoError(t, a.Put(ctx, "k1", v1, ReplicateConfig{Preferred: []string{a.SegmentName()}}))
	require.NoError(t, a.Put(ctx, "k2", v2, ReplicateConfig{Preferred: []string{a.SegmentName()}}))

	got, err := b.Get(ctx, "k1")
	require.NoError(t, err)
	require.Equal(t, v1, got)
	asked := locateCalls(b)
	for range 3 {
		got, err = b.Get(ctx, "k1")
		require.NoError(t, err)
		require.Equal(t, v1, got)
		dst := make([]byte, len(v1))
		n, err := b.GetInto(ctx, "k1", dst)
		require.NoError(t, err)
		require.Equal(t, v1, dst[:n])
	}
	assert.Equal(t, asked, locateCalls(b), "cached gets asked the master")

	vals, errs := b.BatchGet(ctx, []string{"k1", "k2"}) // k2 asks, k1 is cached
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	assert.Equal(t, v1, vals[0])
	assert.Equal(t, v2, vals[1])
	asked = locateCalls(b)
	vals, errs = b.BatchGet(ctx, []string{"k2", "k1"})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	assert.Equal(t, v2, vals[0])
	assert.Equal(t, v1, vals[1])
	assert.Equal(t, asked, locateCalls(b), "a batch of cached keys asked the master")
	st := b.Stats()
	assert.EqualValues(t, 9, st.LocationHits)
	assert.EqualValues(t, 2, st.LocationMisses)

	asked = locateCalls(a) // a has no cache
	for range 2 {
		_, err := a.Get(ctx, "k1")
		require.NoError(t, err)
	}
	assert.Equal(t, asked+2, locateCalls(a))
	assert.Zero(t, a.Stats().LocationHits)
}

// putCached puts round's value of key through a and reads it twice
// through b, the second time from b's location cache.
func putCached(t *testing.T, a, b *Client, key string, round int, rc ReplicateConfig) []byte {
	t.Helper()
	ctx := tctx(t)
	v := testutil.Bytes(8192, uint64(round))
	require.NoError(t, a.Put(ctx, key, v, rc))
	for range 2 {
		got, err := b.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, v, got, "round %d", round)
	}
	return v
}

// TestLocationCacheInvalidatedByRemove: once another client's remove of a
// key answers (forced: the reader holds a lease), the reader does not
// read the old location; a new put under the key is read with its new
// bytes.
func TestLocationCacheInvalidatedByRemove(t *testing.T) {
	_, a, b := locRig(t, master.Config{LeaseTTL: time.Minute})
	ctx := tctx(t)
	here := ReplicateConfig{Preferred: []string{a.SegmentName()}}
	for round := range 3 {
		putCached(t, a, b, "k", round, here)
		require.ErrorIs(t, a.Remove(ctx, "k", false), errcode.ErrObjectHasLease)
		require.NoError(t, a.Remove(ctx, "k", true))
		_, err := b.Get(ctx, "k")
		require.ErrorIs(t, err, errcode.ErrObjectNotFound, "round %d: read after the remove answered", round)
		// Another key takes the freed space; the reader must not see it.
		require.NoError(t, a.Put(ctx, "other", testutil.Bytes(8192, 100+uint64(round)), here))
		_, err = b.Get(ctx, "k")
		require.ErrorIs(t, err, errcode.ErrObjectNotFound)
		require.NoError(t, a.Remove(ctx, "other", true))
	}
	assert.Positive(t, b.Stats().LocationHits)
}

// TestLocationCacheInvalidatedByLoss: when the client holding a key's
// only replica leaves, a reader that cached the key stops reading it
// well before its lease (a minute) would end (the loss's invalidation
// or the failed read of the departed segment drops the entry).
func TestLocationCacheInvalidatedByLoss(t *testing.T) {
	tm := startMaster(t, master.Config{LeaseTTL: time.Minute})
	owner := newTestClient(t, tm, 16<<20)
	b := newTestClient(t, tm, 16<<20, withLocationCache(1024))
	ctx := tctx(t)
	freshLocCache(t, b)
	v := testutil.Bytes(8192, 7)
	require.NoError(t, owner.Put(ctx, "k", v, ReplicateConfig{Preferred: []string{owner.SegmentName()}}))
	for range 2 {
		got, err := b.Get(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, v, got)
	}
	require.EqualValues(t, 1, b.Stats().LocationHits)
	require.NoError(t, owner.Close())
	eventually(t, "the lost key's location dropped", func() bool {
		_, err := b.Get(ctx, "k")
		return errors.Is(err, errcode.ErrObjectNotFound)
	})
}

// TestLocationCacheNotFresh: while the invalidation subscription is not
// fresh (its polls stopped), every get asks the master.
func TestLocationCacheNotFresh(t *testing.T) {
	_, a, b := locRig(t, master.Config{InvalidationTTL: 60 * time.Millisecond})
	ctx := tctx(t)
	require.NoError(t, a.Put(ctx, "k", []byte("value"), ReplicateConfig{}))
	_, err := b.Get(ctx, "k")
	require.NoError(t, err)
	b.locWatch.PauseForTest(true)
	eventually(t, "the subscription to go stale", func() bool { return !b.locWatch.Fresh() })
	asked := locateCalls(b)
	for range 2 {
		got, err := b.Get(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, []byte("value"), got)
	}
	vals, errs := b.BatchGet(ctx, []string{"k"})
	require.NoError(t, errs[0])
	require.Equal(t, []byte("value"), vals[0])
	assert.Equal(t, asked+3, locateCalls(b))
	b.locWatch.PauseForTest(false)
	freshLocCache(t, b)
	_, err = b.Get(ctx, "k")
	require.NoError(t, err)
	asked = locateCalls(b)
	_, err = b.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, asked, locateCalls(b), "fresh again: cached")
}

// TestLocationCacheBadEntryAsksMaster: a cached location that no longer
// reads (here: a segment nobody serves) is dropped and the get asks the
// master once, singly and in a batch.
func TestLocationCacheBadEntryAsksMaster(t *testing.T) {
	_, a, b := locRig(t, master.Config{})
	ctx := tctx(t)
	v := testutil.Bytes(4096, 3)
	for _, k := range []string{"k1", "k2"} {
		require.NoError(t, a.Put(ctx, k, v, ReplicateConfig{}))
	}
	bogus := func(key string) {
		now := b.clock.Now()
		b.loc.put(key, located{size: 4096, reps: []replicaRef{{seg: "127.0.0.1:1", addr: 4096}}, deadline: now.Add(time.Minute)},
			now, b.loc.epoch(key))
		_, hit := b.loc.get(key, now)
		require.True(t, hit)
	}
	bogus("k1")
	asked := locateCalls(b)
	got, err := b.Get(ctx, "k1")
	require.NoError(t, err)
	assert.Equal(t, v, got)
	assert.Equal(t, asked+1, locateCalls(b))

	bogus("k1")
	_, err = b.Get(ctx, "k2") // cache k2's true location
	require.NoError(t, err)
	asked = locateCalls(b)
	dst := [][]byte{make([]byte, 4096), make([]byte, 4096)}
	ns, errs := b.BatchGetInto(ctx, []string{"k1", "k2"}, dst)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	assert.Equal(t, []int{4096, 4096}, ns)
	assert.Equal(t, v, dst[0])
	assert.Equal(t, v, dst[1])
	assert.Equal(t, asked+1, locateCalls(b), "one retry for the bad entry")
}

// TestLocCacheEntries: entries are used for the first three quarters of
// their lease, an answer an invalidation may have overtaken is not
// cached, and the size stays bounded.
func TestLocCacheEntries(t *testing.T) {
	t0 := time.Unix(1000, 0)
	loc := located{size: 1, reps: []replicaRef{{seg: "s", addr: 1}}, deadline: t0.Add(10 * time.Second)}
	lc := newLocCache(64)
	lc.put("k", loc, t0, lc.epoch("k"))
	_, ok := lc.get("k", t0.Add(7400*time.Millisecond))
	assert.True(t, ok)
	_, ok = lc.get("k", t0.Add(7600*time.Millisecond))
	assert.False(t, ok, "past three quarters of the lease")

	for _, inval := range []func(){func() { lc.Invalidate([]string{"k"}) }, lc.InvalidateAll} {
		ep := lc.epoch("k")
		inval()
		lc.put("k", loc, t0, ep)
		_, ok = lc.get("k", t0)
		assert.False(t, ok, "cached across an invalidation")
	}
	lc.put("k", loc, t0, lc.epoch("k"))
	lc.Invalidate([]string{"k"})
	_, ok = lc.get("k", t0)
	assert.False(t, ok)

	for i := range 1000 {
		k := fmt.Sprintf("key%d", i)
		lc.put(k, loc, t0, lc.epoch(k))
	}
	assert.LessOrEqual(t, lc.len(), 64)
	assert.Positive(t, lc.len())
}

// TestGetsUnderChurn: readers read keys that a writer keeps
// force-removing and putting again, with another key put into the freed
// space in between. Every value a read returns must be some version of
// the key asked for, whole: never another key's bytes, never a torn mix.
// With the location cache and without: a get in flight when the forced
// remove lands read the other key's bytes before the master held a
// leased object's space until its lease ended.
func TestGetsUnderChurn(t *testing.T) {
	for _, cache := range []int{0, 64} {
		t.Run(fmt.Sprintf("cache=%d", cache), func(t *testing.T) { getsUnderChurn(t, cache) })
	}
}

func getsUnderChurn(t *testing.T, cache int) {
	const (
		keys  = 24
		size  = 4096
		steps = 1000
	)
	tm := startMaster(t, master.Config{LeaseTTL: 150 * time.Millisecond, EvictInterval: 5 * time.Millisecond})
	w := newTestClient(t, tm, 16<<20, twoRPCPuts)
	r1 := newTestClient(t, tm, 16<<20, withLocationCache(cache))
	r2 := newTestClient(t, tm, 0, withLocationCache(cache)) // no memory of its own
	if cache > 0 {
		freshLocCache(t, r1)
		freshLocCache(t, r2)
	}
	ctx := tctx(t)
	// A value names its key and version in its first 16 bytes and
	// repeats a byte derived from both after them.
	value := func(k, ver int) []byte {
		v := make([]byte, size)
		binary.LittleEndian.PutUint64(v, uint64(k))
		binary.LittleEndian.PutUint64(v[8:], uint64(ver))
		for i := 16; i < size; i++ {
			v[i] = byte(k*31 + ver*7 + i)
		}
		return v
	}
	check := func(k int, v []byte) error {
		if len(v) != size || binary.LittleEndian.Uint64(v) != uint64(k) {
			return fmt.Errorf("key %d: read %d bytes naming key %d", k, len(v), binary.LittleEndian.Uint64(v))
		}
		if want := value(k, int(binary.LittleEndian.Uint64(v[8:]))); !bytes.Equal(v, want) {
			return fmt.Errorf("key %d: a torn or foreign value", k)
		}
		return nil
	}
	own := ReplicateConfig{Preferred: []string{w.SegmentName()}}
	for k := range keys {
		require.NoError(t, w.Put(ctx, fmt.Sprint("c", k), value(k, 0), own))
	}
	done := make(chan struct{})
	errc := make(chan error, 2)
	for _, r := range []*Client{r1, r2} {
		go func() {
			var err error
			for n := 0; err == nil; n++ {
				select {
				case <-done:
					errc <- nil
					return
				default:
				}
				k := n * 7 % keys
				if n%5 == 0 {
					ks := []string{fmt.Sprint("c", k), fmt.Sprint("c", (k+1)%keys)}
					vals, errs := r.BatchGet(ctx, ks)
					for i := range ks {
						if errs[i] == nil {
							err = check((k+i)%keys, vals[i])
						}
					}
					continue
				}
				if v, gerr := r.Get(ctx, fmt.Sprint("c", k)); gerr == nil {
					err = check(k, v)
				}
			}
			errc <- err
		}()
	}
	for n := range steps {
		k := n * 5 % keys
		key := fmt.Sprint("c", k)
		require.NoError(t, w.Remove(ctx, key, true))
		// Another key's bytes into whatever space is free.
		require.NoError(t, w.Put(ctx, "filler", value(keys+n%3, n), own))
		require.NoError(t, w.Remove(ctx, "filler", true))
		require.NoError(t, w.Put(ctx, key, value(k, n+1), own))
	}
	close(done)
	for range 2 {
		require.NoError(t, <-errc)
	}
	if cache > 0 {
		assert.Positive(t, r1.Stats().LocationHits+r2.Stats().LocationHits)
	}
}

// TestLocationCacheCloseUnsubscribes: a client with the cache that closes
// ends its subscription, so the master's removes and puts do not wait
// for it (they would wait InvalidationTTL each for a silent subscriber
// that had polled within the TTL).
func TestLocationCacheCloseUnsubscribes(t *testing.T) {
	tm, a, b := locRig(t, master.Config{InvalidationTTL: 10 * time.Second})
	ctx := tctx(t)
	here := ReplicateConfig{Preferred: []string{a.SegmentName()}} // not on b's segment, which leaves
	require.NoError(t, a.Put(ctx, "k", []byte("v"), here))
	_, err := b.Get(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.NoError(t, a.Remove(ctx, "k", true))
	require.NoError(t, a.Put(ctx, "k", []byte("w"), here))
	assert.Zero(t, tm.m.InvalidationTimeouts(), "a remove or put waited for the closed client")
}

// TestLocationCachePartitionedReader: a reader cut off from the master
// but not from the segment holding a key (its engine path is direct)
// does not serve the key from its location cache once another client's
// forced remove of it has answered: the master answers only after the
// reader's subscription has been silent for a TTL, and the reader's
// entries stop being served a tenth of a TTL before that. Once the
// partition heals, the reader reads what the master says.
func TestLocationCachePartitionedReader(t *testing.T) {
	const ttl = 300 * time.Millisecond
	tm := startMaster(t, master.Config{InvalidationTTL: ttl, LeaseTTL: time.Minute})
	a := newTestClient(t, tm, 16<<20, twoRPCPuts)
	px := testutil.NewProxy(t, tm.addr)
	cut := &testMaster{m: tm.m, addr: px.Addr()}
	b := newTestClient(t, cut, 16<<20, withLocationCache(1024), func(c *Config) { c.RPCTimeout = 2 * time.Second })
	freshLocCache(t, b)
	ctx := tctx(t)
	here := ReplicateConfig{Preferred: []string{a.SegmentName()}}

	for round := range 3 {
		v := putCached(t, a, b, "k", round, here)
		require.Positive(t, b.Stats().LocationHits)

		px.Partition(true)
		// Reads go on from the cache while the subscription is fresh;
		// none may return the value once the remove has answered.
		removed := make(chan error, 1)
		go func() { removed <- a.Remove(ctx, "k", true) }()
		for done := false; !done; {
			select {
			case err := <-removed:
				require.NoError(t, err, "round %d: the remove waits a TTL for the cut reader, no longer", round)
				done = true
			default:
			}
			rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			got, err := b.Get(rctx, "k")
			cancel()
			if done {
				require.Error(t, err, "round %d: a cut reader served %d bytes after the remove answered", round, len(got))
			} else if err == nil {
				require.Equal(t, v, got)
			}
		}
		for range 3 {
			rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			got, err := b.Get(rctx, "k")
			cancel()
			require.Error(t, err, "round %d: a cut reader served %d bytes after the remove answered", round, len(got))
			require.False(t, errors.Is(err, errcode.ErrObjectNotFound), "the master was not reachable: %v", err)
		}
		assert.False(t, b.locWatch.Fresh(), "round %d: fresh with no poll answered for a TTL", round)

		px.Partition(false)
		eventually(t, "the healed reader to see the remove", func() bool {
			_, err := b.Get(ctx, "k")
			return errors.Is(err, errcode.ErrObjectNotFound)
		})
		freshLocCache(t, b)
	}
}
