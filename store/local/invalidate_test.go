package local

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

func startMasterCfg(t testing.TB, cfg master.Config) *testMaster {
	t.Helper()
	m, err := master.New(cfg)
	require.NoError(t, err)
	require.NoError(t, m.Start())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.New(m, service.WithGracePeriod(50*time.Millisecond)).Serve(ctx, lis) }()
	t.Cleanup(sync.OnceFunc(func() {
		cancel()
		<-done
		m.Close()
	}))
	return &testMaster{m: m, addr: lis.Addr().String()}
}

// twoHosts is a real client A serving a dummy with a shared hot cache,
// and a second real client B (another host, as far as A's cache can
// tell) on the same master.
func twoHosts(t *testing.T, cfg master.Config) (*Server, *Dummy, *store.Client, *testMaster) {
	if cfg.InvalidationTTL == 0 {
		cfg.InvalidationTTL = 5 * time.Second // hits do not flap on a loaded machine
	}
	tm := startMasterCfg(t, cfg)
	a := newRealClient(t, tm)
	opts := shmCache()
	opts.Logger = quiet
	s, err := Serve(a, filepath.Join(t.TempDir(), "crescent.sock"), opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s, dial(t, s), newRealClient(t, tm), tm
}

// cacheHot makes key a published block in s's cache and checks that the
// next get is a hit.
func cacheHot(t *testing.T, s *Server, d *Dummy, key string, want []byte) {
	ctx := tctx(t)
	for range 2 { // the second miss admits and publishes
		b, err := d.GetBuffer(ctx, key)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, b.Bytes()))
		b.Release()
	}
	// A loaded machine may let the subscription lapse for a moment (then
	// the get is a miss): try until one is a hit.
	require.Eventually(t, func() bool {
		hits := s.Stats().Hits
		got, err := d.Get(ctx, key)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got))
		return s.Stats().Hits == hits+1
	}, 30*time.Second, time.Millisecond, "no hot hit")
}

// notOld checks that key reads as cur or not found, never old.
func notOld(t *testing.T, d *Dummy, key string, old, cur []byte) {
	t.Helper()
	ctx := tctx(t)
	got, err := d.Get(ctx, key)
	if err != nil {
		require.ErrorIs(t, err, errcode.ErrObjectNotFound)
		return
	}
	require.False(t, bytes.Equal(old, got), "the hot cache served the replaced value")
	if cur != nil {
		require.True(t, bytes.Equal(cur, got), "neither the old nor the new value")
	}
	b, err := d.GetBuffer(ctx, key)
	if err == nil {
		require.False(t, bytes.Equal(old, b.Bytes()), "the hot cache viewed the replaced value")
		b.Release()
	}
}

// TestHotCacheOtherHostRemoves is the sequence of the issue: A caches K
// (a hit within its read lease); B, on another host, force-removes K
// (and re-puts it with other bytes) by each destructive path; A's next
// get returns the new bytes or not found, never the old.
func TestHotCacheOtherHostRemoves(t *testing.T) {
	old, cur := val(64<<10, 1), val(64<<10, 2)
	cases := map[string]func(ctx context.Context, b *store.Client, key string) error{
		"remove": func(ctx context.Context, b *store.Client, key string) error { return b.Remove(ctx, key, true) },
		"batch remove": func(ctx context.Context, b *store.Client, key string) error {
			return b.BatchRemove(ctx, []string{key}, true)[0]
		},
		"remove all": func(ctx context.Context, b *store.Client, _ string) error {
			_, err := b.RemoveAll(ctx, true)
			return err
		},
		"remove by regex": func(ctx context.Context, b *store.Client, key string) error {
			n, err := b.RemoveByRegex(ctx, "k.*", true)
			if err == nil && n != 1 {
				t.Errorf("regex removed %d", n)
			}
			return err
		},
	}
	for name, remove := range cases {
		for _, reput := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "", true: " and re-put"}[reput], func(t *testing.T) {
				s, d, b, tm := twoHosts(t, master.Config{})
				require.Equal(t, "crpc", s.c.MasterProtocol())
				ctx := tctx(t)
				require.NoError(t, b.Put(ctx, "k1", old, store.ReplicateConfig{Preferred: []string{b.SegmentName()}}))
				cacheHot(t, s, d, "k1", old)
				require.NoError(t, remove(ctx, b, "k1"))
				var want []byte
				if reput {
					want = cur
					require.NoError(t, b.Put(ctx, "k1", cur, store.ReplicateConfig{Preferred: []string{b.SegmentName()}}))
				}
				notOld(t, d, "k1", old, want)
				assert.Zero(t, tm.m.InvalidationTimeouts(), "the subscriber did not acknowledge")
			})
		}
	}
}

// TestHotCacheOwnClientRemoves: the subscribing client itself removes
// (and re-puts) a cached key: the master's barrier waits for an
// acknowledgement that comes on the same connection as the remove, so
// the remove must not hold that connection (a crpc call run on the
// connection's reader would, until the TTL).
func TestHotCacheOwnClientRemoves(t *testing.T) {
	old, cur := val(64<<10, 1), val(64<<10, 2)
	for _, reput := range []bool{false, true} {
		s, d, _, tm := twoHosts(t, master.Config{})
		require.Equal(t, "crpc", s.c.MasterProtocol())
		ctx := tctx(t)
		rc := store.ReplicateConfig{Preferred: []string{s.c.SegmentName()}}
		require.NoError(t, s.c.Put(ctx, "k1", old, rc))
		cacheHot(t, s, d, "k1", old)
		require.NoError(t, s.c.Remove(ctx, "k1", true))
		var want []byte
		if reput {
			want = cur
			require.NoError(t, s.c.Put(ctx, "k1", cur, rc))
		}
		notOld(t, d, "k1", old, want)
		assert.Zero(t, tm.m.InvalidationTimeouts(), "the acknowledgement was held behind the remove")
	}
}

// TestHotCacheEviction: eviction never takes a leased object, but once
// the lease is over it may, and the space may go to a re-put of the same
// key; the cache, asking the master again after the lease, must not take
// the new replica at the same place for the old bytes.
func TestHotCacheEviction(t *testing.T) {
	s, d, b, tm := twoHosts(t, master.Config{LeaseTTL: 2 * time.Second})
	ctx := tctx(t)
	old, cur := val(64<<10, 3), val(64<<10, 4)
	rc := store.ReplicateConfig{Preferred: []string{b.SegmentName()}}
	require.NoError(t, b.Put(ctx, "k", old, rc))
	cacheHot(t, s, d, "k", old)
	before, err := b.Locate(ctx, "k")
	require.NoError(t, err)
	// The lease ends; a round then evicts k.
	require.Eventually(t, func() bool { return tm.m.Evict().Keys > 0 }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, b.Put(ctx, "k", cur, rc))
	after, err := b.Locate(ctx, "k")
	require.NoError(t, err)
	if before.Replicas[0] != after.Replicas[0] {
		t.Logf("the re-put went elsewhere (%v, then %v)", before.Replicas[0], after.Replicas[0])
	}
	notOld(t, d, "k", old, cur)
}

// TestHotCacheLapsedSubscription: a cache whose subscription stopped
// answering serves no hits, and a forced remove on the master completes
// within the subscription TTL instead of waiting for it forever; once the
// subscription is back, the remove it missed is applied before any hit.
func TestHotCacheLapsedSubscription(t *testing.T) {
	ttl := 2 * time.Second
	s, d, b, tm := twoHosts(t, master.Config{InvalidationTTL: ttl})
	ctx := tctx(t)
	old, cur := val(64<<10, 5), val(64<<10, 6)
	rc := store.ReplicateConfig{Preferred: []string{b.SegmentName()}}
	require.NoError(t, b.Put(ctx, "k", old, rc))
	require.NoError(t, b.Put(ctx, "other", cur, rc))
	cacheHot(t, s, d, "k", old)
	cacheHot(t, s, d, "other", cur)
	require.Equal(t, 1, tm.m.Subscribers())

	s.watch.PauseForTest(true) // as if A were stopped (SIGSTOP)
	require.Eventually(t, func() bool { return !s.watch.Fresh() }, 10*time.Second, 5*time.Millisecond)
	hits := s.Stats().Hits
	got, err := d.Get(ctx, "other")
	require.NoError(t, err)
	require.True(t, bytes.Equal(cur, got))
	assert.Equal(t, hits, s.Stats().Hits, "a lapsed subscription served a hit")
	assert.NotZero(t, s.Stats().StaleMisses)

	// The remove does not wait for A (its freshness has run out), or at
	// most one TTL if A had just been fresh.
	timeouts := tm.m.InvalidationTimeouts()
	rctx, cancel := context.WithTimeout(ctx, 20*ttl)
	defer cancel()
	require.NoError(t, b.Remove(rctx, "k", true))
	require.NoError(t, b.Put(rctx, "k", cur, rc))
	require.Greater(t, tm.m.InvalidationTimeouts(), timeouts, "the master did not wait for the stopped subscriber")
	notOld(t, d, "k", old, cur)

	s.watch.PauseForTest(false)
	require.NoError(t, s.watch.WaitFresh(ctx))
	notOld(t, d, "k", old, cur)
	cacheHot(t, s, d, "other", cur) // hits again
}

// TestHotCacheOverflowResets: invalidations piling up past the master's
// queue bound for a subscriber that does not poll are replaced by a
// reset: when it polls again it drops every block, the ones whose keys
// were not removed too.
func TestHotCacheOverflowResets(t *testing.T) {
	s, d, b, _ := twoHosts(t, master.Config{InvalidationTTL: 2 * time.Second})
	ctx := tctx(t)
	v := val(4096, 8)
	require.NoError(t, b.Put(ctx, "k", v, store.ReplicateConfig{}))
	cacheHot(t, s, d, "k", v)
	s.watch.PauseForTest(true)
	n := master.MaxInvalidationQueue + 1
	for i := 0; i < n; i += 1024 {
		var keys []string
		var vals [][]byte
		for j := i; j < min(i+1024, n); j++ {
			keys = append(keys, fmt.Sprint("x", j))
			vals = append(vals, v[:64])
		}
		for _, err := range b.BatchPut(ctx, keys, vals, store.ReplicateConfig{}) {
			require.NoError(t, err)
		}
	}
	removed, err := b.RemoveByRegex(ctx, "x.*", false)
	require.NoError(t, err)
	require.EqualValues(t, n, removed)
	resets := s.watch.Resets()
	s.watch.PauseForTest(false)
	require.Eventually(t, func() bool { return s.watch.Resets() > resets }, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, s.watch.WaitFresh(ctx))
	require.Nil(t, s.hot.acquire("k"), "a reset left a block")
	cacheHot(t, s, d, "k", v)
}

// TestHotCacheOverGRPC: the subscription works over gRPC as over crpc.
func TestHotCacheOverGRPC(t *testing.T) {
	tm := startMasterCfg(t, master.Config{InvalidationTTL: 5 * time.Second})
	ctx := tctx(t)
	a, err := store.New(ctx, store.Config{MasterAddr: tm.addr, MasterProtocol: "grpc", LocalHostname: "127.0.0.1",
		GlobalSegmentSize: 64 << 20, LocalBufferSize: 16 << 20, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	require.Equal(t, "grpc", a.MasterProtocol())
	opts := shmCache()
	opts.Logger = quiet
	s, err := Serve(a, filepath.Join(t.TempDir(), "crescent.sock"), opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	d, b := dial(t, s), newRealClient(t, tm)
	old, cur := val(8192, 9), val(8192, 10)
	rc := store.ReplicateConfig{Preferred: []string{b.SegmentName()}}
	require.NoError(t, b.Put(ctx, "k", old, rc))
	cacheHot(t, s, d, "k", old)
	require.NoError(t, b.Remove(ctx, "k", true))
	require.NoError(t, b.Put(ctx, "k", cur, rc))
	notOld(t, d, "k", old, cur)
	assert.Zero(t, tm.m.InvalidationTimeouts(), "the subscriber over gRPC did not acknowledge")
}
