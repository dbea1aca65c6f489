package store

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestMountOverlapRefusedEndToEnd: a second client mounting the first
// one's engine segment range (same name, base, size) would make the master
// place two objects on the same bytes, and Gets would return another key's
// value with no error. The master refuses the mount; every put then reads
// back its own bytes.
func TestMountOverlapRefusedEndToEnd(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 4<<20, twoRPCPuts)
	b := newTestClient(t, tm, 0, twoRPCPuts)
	ctx := tctx(t)
	sa := a.segList()[0].info
	dup := &storepb.Segment{Id: newUUID().pb(), Name: sa.Name, Base: sa.Base, Size: sa.Size, Protocol: sa.Protocol}
	_, err := b.master.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: b.id.pb(), Session: b.session, Segment: dup})
	assert.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrSegmentAlreadyExists)

	const n = 40
	val := func(i int) []byte { return bytes.Repeat([]byte{byte(i + 1)}, 16<<10) }
	for i := range n {
		c := a
		if i%2 == 1 {
			c = b
		}
		require.NoError(t, c.Put(ctx, fmt.Sprintf("key-%02d", i), val(i), ReplicateConfig{}))
	}
	for i := range n {
		got, err := b.Get(ctx, fmt.Sprintf("key-%02d", i))
		require.NoError(t, err)
		assert.True(t, bytes.Equal(got, val(i)), "key-%02d read back another key's bytes", i)
	}
}

// TestLatePutEndAfterTakeOver: a put stalls between PutStart and its
// writes long enough (PutDiscardTimeout) for another PutStart of the key
// to take it over. Its PutEnd must fail (REPLICA_IS_GONE), not complete
// the successor's put, whose replicas nobody wrote.
func TestLatePutEndAfterTakeOver(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			clk := clock.NewFake(time.Now())
			tm := startMaster(t, master.Config{Clock: clk, ClientTTL: time.Hour}) // no expiry when the clock jumps
			a := newTestClient(t, tm, 4<<20, twoRPCPuts)
			ctx := tctx(t)
			a.beforeWrite = func() {
				a.beforeWrite = nil
				clk.Advance(time.Minute)
				// The successor: the same client id (a restarted writer, a
				// retry from another goroutine).
				_, err := a.master.PutStart(ctx, &storepb.PutStartRequest{ClientId: a.id.pb(), Session: a.session, Key: "k", Size: 16 << 10})
				require.NoError(t, err)
			}
			v := bytes.Repeat([]byte{7}, 16<<10)
			var err error
			if batch {
				err = a.BatchPut(ctx, []string{"k"}, [][]byte{v}, ReplicateConfig{})[0]
			} else {
				err = a.Put(ctx, "k", v, ReplicateConfig{})
			}
			require.ErrorIs(t, err, errcode.ErrReplicaIsGone)
			info, err := tm.m.QueryKey("k")
			require.NoError(t, err)
			require.False(t, info.Complete, "the successor's unwritten put was completed")
		})
	}
}

// TestCloseIsNotAnExpiry: a client's Close leaves the master at once: it
// is no longer an active client, and neither its departure nor the
// objects that went with its segment count as an expiry or a loss. A
// client that falls silent does.
func TestCloseIsNotAnExpiry(t *testing.T) {
	clk := clock.NewFake(time.Now())
	tm := startMaster(t, master.Config{Clock: clk})
	a := newTestClient(t, tm, 4<<20, twoRPCPuts)
	b := newTestClient(t, tm, 4<<20, twoRPCPuts)
	ctx := tctx(t)
	for i, c := range []*Client{a, a, a, b, b} {
		require.NoError(t, c.Put(ctx, fmt.Sprint("k", i), []byte("value"), ReplicateConfig{Preferred: []string{c.SegmentName()}}))
	}
	require.Equal(t, 2, tm.m.Stats().ActiveClients)
	require.NoError(t, a.Close())
	st := tm.m.Stats()
	require.Equal(t, 1, st.ActiveClients)
	require.Equal(t, uint64(1), st.DepartedClients)
	require.Equal(t, uint64(3), st.UnmountedKeys)
	require.Zero(t, st.LostKeys)
	require.Zero(t, st.ExpiredClients)

	b.hbPaused.Store(true)
	clk.Advance(time.Minute)
	eventually(t, "b's expiry", func() bool { return tm.m.Stats().ExpiredClients == 1 })
	st = tm.m.Stats()
	require.Zero(t, st.ActiveClients)
	require.Equal(t, uint64(2), st.LostKeys)
	require.Equal(t, uint64(1), st.DepartedClients)
	require.Equal(t, uint64(3), st.UnmountedKeys)
}
