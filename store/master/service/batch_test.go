package service

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestBatchPutReplyAllocs: the batch put handlers build their replies
// with one allocation per message type, not one per message per item
// (protobuf replies were a fifth of the master's CPU in --operation meta),
// and the replies still describe every item.
func TestBatchPutReplyAllocs(t *testing.T) {
	const batch, runs = 128, 20
	s, id, sizes := handlerRig(t, batch)
	ctx := context.Background()
	// Past the first growths of the master's tables.
	for i := range 100_000 / batch {
		ks := make([]string, batch)
		for j := range ks {
			ks[j] = blockKey(nil, 1<<30+i*batch+j)
		}
		_, err := s.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: id, Keys: ks, Sizes: sizes})
		require.NoError(t, err)
		_, err = s.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: id, Keys: ks})
		require.NoError(t, err)
	}
	reqs := make([]*storepb.BatchPutStartRequest, runs+1) // AllocsPerRun warms up once
	ends := make([]*storepb.BatchPutEndRequest, runs+1)
	for r := range reqs {
		ks := make([]string, batch)
		for i := range ks {
			ks[i] = blockKey(nil, r*batch+i)
		}
		reqs[r] = &storepb.BatchPutStartRequest{ClientId: id, Keys: ks, Sizes: sizes}
		ends[r] = &storepb.BatchPutEndRequest{ClientId: id, Keys: ks}
	}
	// Checked after the count (testify allocates).
	starts := make([]*storepb.BatchPutStartResponse, 0, len(reqs))
	dones := make([]*storepb.BatchPutEndResponse, 0, len(reqs))
	var failed []error
	allocs := testing.AllocsPerRun(runs, func() {
		r := len(starts)
		st, err := s.BatchPutStart(ctx, reqs[r])
		starts = append(starts, st)
		en, err2 := s.BatchPutEnd(ctx, ends[r])
		dones = append(dones, en)
		if err != nil || err2 != nil {
			failed = append(failed, err, err2)
		}
	})
	require.Empty(t, failed)
	perKey := allocs / batch
	t.Logf("%.2f allocations per key", perKey)
	// The master's own share is about 1 (master.TestBatchPutAllocs).
	require.LessOrEqual(t, perKey, 1.5)
	for r := range reqs {
		require.Len(t, starts[r].Results, batch)
		require.Len(t, dones[r].Results, batch)
		for i, res := range starts[r].Results {
			require.Zero(t, res.ErrorCode, res.Message)
			require.Len(t, res.Replicas, 1)
			rep := res.Replicas[0]
			require.Equal(t, storepb.ReplicaStatus(master.StatusProcessing), rep.Status)
			require.Equal(t, uint64(4096), rep.Memory.Size)
			require.NotNil(t, rep.Memory.SegmentId)
			require.Equal(t, uint64(5), rep.Memory.SegmentId.High)
			require.NotEmpty(t, rep.Memory.SegmentName)
			require.Zero(t, dones[r].Results[i].ErrorCode)
		}
	}
}

// TestSingleReplicaReplyAllocs: a single-key reply (GetReplicaList, a
// CommitPut's replacement reservation) describes its replica with one
// allocation, and the descriptor carries every field.
func TestSingleReplicaReplyAllocs(t *testing.T) {
	rs := []master.Replica{{Type: master.Memory, Status: master.StatusComplete, SegmentName: "127.0.0.1:12345",
		SegmentID: master.UUID{Hi: 7, Lo: 9}, Addr: 4096, Size: 1 << 20, Protocol: "shm"}}
	var out []*storepb.ReplicaDescriptor
	allocs := testing.AllocsPerRun(100, func() { out = replicasPB(rs) })
	require.Equal(t, 1.0, allocs)
	require.Len(t, out, 1)
	require.Equal(t, 1, cap(out))
	m := out[0].Memory
	require.Equal(t, storepb.ReplicaStatus(master.StatusComplete), out[0].Status)
	require.Equal(t, "127.0.0.1:12345", m.SegmentName)
	require.Equal(t, uint64(4096), m.BufferAddress)
	require.Equal(t, uint64(1<<20), m.Size)
	require.Equal(t, "shm", m.Protocol)
	require.Equal(t, uint64(7), m.SegmentId.High)
	require.Equal(t, uint64(9), m.SegmentId.Low)

	// A batch's descriptors are distinct messages.
	two := newReplicaBuf(2)
	a, b := two.add(rs), two.add(rs)
	require.NotSame(t, a[0], b[0])
	require.NotSame(t, a[0].Memory, b[0].Memory)
	require.NotSame(t, a[0].Memory.SegmentId, b[0].Memory.SegmentId)
}

// TestBatchRepliesOwnTheirData: BatchPutStart and BatchGetReplicaList
// reuse their result arrays from call to call, so a reply must hold
// copies: replies made concurrently, in both forms, each keep their own
// addresses after other calls have reused the arrays.
func TestBatchRepliesOwnTheirData(t *testing.T) {
	const batch, workers, calls = 32, 4, 25
	s, id, sizes := handlerRig(t, batch)
	ctx := context.Background()
	type reply struct {
		packed bool
		r      *storepb.BatchPutStartResponse
		keys   []string
	}
	addrs := func(packed bool, p *storepb.PackedReplicas, items [][]*storepb.ReplicaDescriptor) []uint64 {
		var out []uint64
		if packed {
			require.NotNil(t, p)
			var err error
			items, err = p.Unpack(batch)
			require.NoError(t, err)
		}
		for _, e := range items {
			for _, d := range e {
				out = append(out, d.Memory.BufferAddress)
			}
		}
		return out
	}
	putAddrs := func(p reply) []uint64 {
		var items [][]*storepb.ReplicaDescriptor
		for _, x := range p.r.Results {
			items = append(items, x.Replicas)
		}
		return addrs(p.packed, p.r.Packed, items)
	}
	replies := make([][]reply, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for c := range calls {
				ks := make([]string, batch)
				for i := range ks {
					ks[i] = blockKey(nil, (w*calls+c)*batch+i)
				}
				packed := c%2 == 1
				r, err := s.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: id, Keys: ks, Sizes: sizes, Packed: packed})
				if err != nil {
					t.Error(err)
					return
				}
				replies[w] = append(replies[w], reply{packed: packed, r: r, keys: ks})
			}
		})
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for w := range replies {
		require.Len(t, replies[w], calls)
		for _, p := range replies[w] {
			got := putAddrs(p)
			require.Len(t, got, batch)
			for _, a := range got {
				require.False(t, seen[a], "address %#x in two replies", a)
				seen[a] = true
			}
			_, err := s.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: id, Keys: p.keys})
			require.NoError(t, err)
		}
	}

	// Reads of every batch at once; each reply must still name its own
	// keys' addresses when all are done.
	type read struct {
		packed bool
		r      *storepb.BatchGetReplicaListResponse
		want   []uint64
	}
	reads := make([][]read, workers)
	for w := range workers {
		wg.Go(func() {
			for c, p := range replies[w] {
				packed := c%2 == 0
				r, err := s.BatchGetReplicaList(ctx, &storepb.BatchGetReplicaListRequest{Keys: p.keys, Packed: packed})
				if err != nil {
					t.Error(err)
					return
				}
				reads[w] = append(reads[w], read{packed: packed, r: r, want: putAddrs(p)})
			}
		})
	}
	wg.Wait()
	for w := range reads {
		require.Len(t, reads[w], calls)
		for _, rd := range reads[w] {
			var items [][]*storepb.ReplicaDescriptor
			for _, x := range rd.r.Results {
				items = append(items, x.Replicas)
			}
			require.Equal(t, rd.want, addrs(rd.packed, rd.r.Packed, items))
		}
	}
}
