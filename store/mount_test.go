package store

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
)

func segPool(t *testing.T, c *Client, id UUID) interface{ Stats() mempool.Stats } {
	for _, s := range c.segList() {
		if s.info.ID == id {
			return s.pool
		}
	}
	t.Fatalf("segment %s not mounted", id)
	return nil
}

func pings(c *Client) uint64 { return c.Stats().RPC["Ping"].Calls }

func mountedOnMaster(tm *testMaster, id UUID) bool {
	for _, s := range tm.m.AllSegments() {
		if UUID(s.ID) == id {
			return true
		}
	}
	return false
}

// TestMountStartsHeartbeat: a client with no segment sends no Ping;
// Mount after New starts the heartbeat, Unmount of the last segment
// stops it (and the master forgets the segment).
func TestMountStartsHeartbeat(t *testing.T) {
	tm := startMaster(t, master.Config{})
	ctx := tctx(t)
	peer := newTestClient(t, tm, 16<<20, protocols("tcp"))
	c := newTestClient(t, tm, 0, protocols("tcp"), func(cfg *Config) { cfg.HeartbeatInterval = time.Millisecond })
	for i := range 20 {
		k, v := fmt.Sprintf("k%d", i), testutil.Bytes(4096, uint64(i))
		require.NoError(t, c.Put(ctx, k, v, ReplicateConfig{}))
		got, err := c.Get(ctx, k)
		require.NoError(t, err)
		require.True(t, bytes.Equal(v, got))
	}
	assert.False(t, c.heartbeating())
	assert.Zero(t, pings(c), "a client with no segment pinged")

	a, err := c.Mount(ctx, 8<<20)
	require.NoError(t, err)
	assert.True(t, c.heartbeating())
	assert.True(t, mountedOnMaster(tm, a.ID))
	eventually(t, "pings", func() bool { return pings(c) >= 3 })
	b, err := c.Mount(ctx, 8<<20)
	require.NoError(t, err)
	assert.Len(t, c.Segments(), 2)

	// Objects can be placed on the new segments.
	v := testutil.Bytes(4096, 99)
	require.NoError(t, c.Put(ctx, "mine", v, ReplicateConfig{Preferred: []string{c.SegmentName()}}))
	assert.Equal(t, []string{c.SegmentName()}, segmentsOf(t, tm, "mine"))
	got, err := peer.Get(ctx, "mine")
	require.NoError(t, err)
	require.True(t, bytes.Equal(v, got))

	poolA, poolB := segPool(t, c, a.ID), segPool(t, c, b.ID)
	// A Buffer viewing the client's memory keeps unmounted segments mapped.
	buf, err := c.GetBuffer(ctx, "mine")
	require.NoError(t, err)
	require.True(t, buf.Local())
	require.NoError(t, c.Unmount(ctx, a.ID))
	assert.True(t, c.heartbeating(), "one segment is still mounted")
	assert.False(t, mountedOnMaster(tm, a.ID))
	assert.False(t, poolA.Stats().Closed, "unmapped under a Buffer")
	buf.Release()
	assert.True(t, poolA.Stats().Closed, "not unmapped at the last Release")
	require.NoError(t, c.Unmount(ctx, b.ID))
	assert.False(t, c.heartbeating())
	assert.False(t, mountedOnMaster(tm, b.ID))
	assert.True(t, poolB.Stats().Closed, "not unmapped at Unmount")
	n := pings(c)
	for i := range 20 {
		_, err := c.IsExist(ctx, fmt.Sprintf("k%d", i))
		require.NoError(t, err)
	}
	assert.Equal(t, n, pings(c), "pinged after the last unmount")
	assert.Empty(t, c.Segments())

	err = c.Unmount(ctx, a.ID)
	require.ErrorIs(t, err, errcode.ErrSegmentNotFound)
	_, err = c.Mount(ctx, 0)
	require.ErrorIs(t, err, errcode.ErrInvalidParams)
}
