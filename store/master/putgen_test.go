package master

import (
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/errcode"
)

// TestStalePutEndRefused: a writer whose put was taken over (after
// PutDiscardTimeout) must not end or revoke its successor's put, nor be
// told its bytes were stored, whoever the successor is.
func TestStalePutEndRefused(t *testing.T) {
	for _, tc := range []struct {
		name      string
		successor UUID
		replace   func(e *env) // makes the old put go away
	}{
		{"taken over by the same client", cl(1), func(e *env) { e.clk.Advance(e.m.cfg.PutDiscardTimeout) }},
		{"taken over by another client", cl(2), func(e *env) { e.clk.Advance(e.m.cfg.PutDiscardTimeout) }},
		{"force-removed and put again", cl(1), func(e *env) { require.NoError(t, e.m.Remove("k", true)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			a := cl(1)
			e.mount(a, "host:1", 1<<20)
			_, g1, err := e.m.PutStartGen(a, "k", 4096, ReplicateConfig{})
			require.NoError(t, err)
			require.NotZero(t, g1)
			tc.replace(e)
			_, g2, err := e.m.PutStartGen(tc.successor, "k", 4096, ReplicateConfig{})
			require.NoError(t, err)
			require.NotEqual(t, g1, g2)

			// The late writer is refused and changes nothing.
			require.ErrorIs(t, e.m.PutEndGen(a, "k", g1, Memory, nil), errcode.ErrReplicaIsGone)
			require.ErrorIs(t, e.m.PutRevokeGen(a, "k", g1, Memory), errcode.ErrReplicaIsGone)
			require.False(t, e.exists("k"))
			info, err := e.m.QueryKey("k")
			require.NoError(t, err)
			require.Equal(t, tc.successor, info.Owner)

			require.NoError(t, e.m.PutEndGen(tc.successor, "k", g2, Memory, nil))
			require.True(t, e.exists("k"))
			// Once complete: a retried PutEnd of the same put succeeds, the
			// stale one is still refused.
			require.NoError(t, e.m.PutEndGen(tc.successor, "k", g2, Memory, nil))
			require.ErrorIs(t, e.m.PutEndGen(a, "k", g1, Memory, nil), errcode.ErrReplicaIsGone)
			require.ErrorIs(t, e.m.PutRevokeGen(a, "k", g1, Memory), errcode.ErrReplicaIsGone)
			checkInvariants(t, e.m)

			// The log replays to the same state, generations included, and a
			// stale PutEnd in a log diverges.
			standby, err := New(Config{Shards: 3, Clock: e.clk})
			require.NoError(t, err)
			for _, op := range e.log.all() {
				require.NoError(t, standby.Replay(op))
			}
			require.Empty(t, diffState(dumpState(e.m), dumpState(standby)))
			_, g3, err := e.m.PutStartGen(a, "k2", 4096, ReplicateConfig{})
			require.NoError(t, err)
			ops := e.log.all()
			require.NoError(t, standby.Replay(ops[len(ops)-1]))
			require.ErrorIs(t, standby.Replay(&Op{Kind: OpPutEnd, Key: "k2", Client: a, Gen: g3 + 1}), ErrReplayDiverged)
			require.ErrorIs(t, standby.Replay(&Op{Kind: OpPutRevoke, Key: "k2", Client: a, Gen: g3 + 1}), ErrReplayDiverged)
			require.NoError(t, standby.Replay(&Op{Kind: OpPutEnd, Key: "k2", Client: a, Gen: g3, Time: e.m.now()}))
		})
	}
}

// TestPutGenerationsBatch covers the batch forms: each item is checked
// against its own generation; a generation list of the wrong length fails
// the batch.
func TestPutGenerationsBatch(t *testing.T) {
	e := newEnv(t, nil)
	a := cl(1)
	e.mount(a, "host:1", 1<<20)
	res, err := e.m.BatchPutStart(a, []string{"x", "y", "z"}, []uint64{10, 10, 10}, ReplicateConfig{})
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err)
		require.NotZero(t, r.Gen)
	}
	_, err = e.m.BatchPutEndGen(a, []string{"x", "y"}, []uint64{1}, Memory, nil)
	require.ErrorIs(t, err, errcode.ErrInvalidParams)
	_, err = e.m.BatchPutRevokeGen(a, []string{"x", "y"}, []uint64{1}, Memory)
	require.ErrorIs(t, err, errcode.ErrInvalidParams)
	errs, err := e.m.BatchPutEndGen(a, []string{"x", "y"}, []uint64{res[0].Gen, res[0].Gen}, Memory, nil)
	require.NoError(t, err)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], errcode.ErrReplicaIsGone)
	errs, err = e.m.BatchPutRevokeGen(a, []string{"y", "z"}, []uint64{res[2].Gen, res[2].Gen}, Memory)
	require.NoError(t, err)
	require.ErrorIs(t, errs[0], errcode.ErrReplicaIsGone)
	require.NoError(t, errs[1])
	// Generation 0 is not checked (the reference's clients send none).
	require.NoError(t, e.m.PutEnd(a, "y", Memory, nil))
	require.NoError(t, e.m.PutEnd(a, "x", Memory, nil))
}

// TestRecordSize: the generation fits the record's padding; a record
// stays 56 bytes (doc.go, BenchmarkBytesPerKey).
func TestRecordSize(t *testing.T) {
	require.Equal(t, uintptr(56), unsafe.Sizeof(object{}))
}

// TestBatchGensAcrossWrap: a batch takes its generations in one block;
// none of them may have the low 32 bits a record keeps equal to 0 (0
// means "not checked"), also when the block spans the wrap, and the
// next batch's are all above the block.
func TestBatchGensAcrossWrap(t *testing.T) {
	e := newEnv(t, nil)
	e.mount(cl(1), "host:1", 64<<20)
	e.m.putGen.Store(1<<32 - 3)
	keys := []string{"a", "b", "c", "d", "e", "f"}
	sizes := []uint64{1, 1, 1, 1, 1, 1}
	res, err := e.m.BatchPutStart(cl(1), keys, sizes, ReplicateConfig{})
	require.NoError(t, err)
	seen := map[uint64]bool{}
	var top uint64
	for i, r := range res {
		require.NoError(t, r.Err)
		require.NotZero(t, uint32(r.Gen), "key %s", keys[i])
		require.False(t, seen[r.Gen])
		seen[r.Gen] = true
		top = max(top, r.Gen)
	}
	errs, err := e.m.BatchPutEndGen(cl(1), keys, func() []uint64 {
		g := make([]uint64, len(res))
		for i, r := range res {
			g[i] = r.Gen
		}
		return g
	}(), Memory, nil)
	require.NoError(t, err)
	for _, err := range errs {
		require.NoError(t, err)
	}
	_, g, err := e.m.PutStartGen(cl(1), "z", 1, ReplicateConfig{})
	require.NoError(t, err)
	require.Greater(t, g, top)
	require.NoError(t, e.m.CheckInvariants())
}

// TestExtRecycled: the record a PutEnd frees goes back to a pool and
// serves a later put; nothing of the earlier put (owner, pin TTL,
// replicas, hashes) shows in the later one.
func TestExtRecycled(t *testing.T) {
	e := newEnv(t, nil)
	for c := uint64(1); c <= 3; c++ {
		e.mount(cl(c), fmt.Sprintf("host:%d", c), 1<<24)
	}
	ext := func(key string) objExt {
		sh, h := e.m.locate(key)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		o := sh.get(key, h)
		require.NotNil(t, o, key)
		if o.ext == nil {
			return objExt{}
		}
		return *o.ext
	}
	for i := range 300 {
		c := cl(uint64(i%3 + 1))
		rc := ReplicateConfig{Replicas: i%2 + 1}
		if i%4 == 0 {
			rc.SoftPin, rc.SoftPinTTL = true, time.Duration(i+1)*time.Second
		}
		key := fmt.Sprintf("k%d", i)
		_, gen, err := e.m.PutStartGen(c, key, 4096, rc)
		require.NoError(t, err)
		x := ext(key)
		require.Equal(t, c, x.owner, key)
		require.Equal(t, int64(rc.SoftPinTTL), x.pinTTL, key)
		require.Len(t, x.more, rc.Replicas-1, key)
		require.Zero(t, x.pin, key)
		require.Nil(t, x.hashes, key)
		require.NoError(t, e.m.PutEndGen(c, key, gen, Memory, &BlockMeta{BlockHashes: []uint64{uint64(i)}}))
		x = ext(key)
		require.True(t, x.owner.IsZero(), key)
		require.Equal(t, int64(rc.SoftPinTTL), x.pinTTL, key)
	}
	require.NoError(t, e.m.CheckInvariants())
}
