package service

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestPackedReplies: asked for the packed form, BatchPutStart, reserve
// specs and BatchGetReplicaList describe exactly the replicas the
// unpacked form does (the master's later BatchGetReplicaList of the
// same objects), failed items included as empty entries.
func TestPackedReplies(t *testing.T) {
	e := mastertest.New(t, nil)
	e.Mount(mastertest.Client(1), "host:1", 64<<20)
	e.Mount(mastertest.Client(2), "host:2", 64<<20)
	s := New(e.M)
	ctx := context.Background()
	id := pbID(mastertest.Client(1))
	two := &storepb.ReplicateConfig{ReplicaNum: 2}

	keys := []string{"p0", "", "p2", "p3"}
	st, err := s.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: id, Keys: keys, Sizes: []uint64{4096, 4096, 8192, 100}, Config: two, Packed: true})
	require.NoError(t, err)
	require.NotNil(t, st.Packed)
	started, err := st.Packed.Unpack(len(keys))
	require.NoError(t, err)
	assert.Empty(t, st.Results, "results go packed too")
	so, err := st.PackedResults.Unpack(len(keys), true)
	require.NoError(t, err)
	assert.Equal(t, []int32{0, int32(errcode.InvalidKey), 0, 0}, so.Codes)
	assert.NotEmpty(t, so.Message(1))
	assert.Empty(t, started[1], "a failed item has no replica")
	for i, g := range so.Values {
		if i != 1 {
			assert.NotZero(t, g, "generation of item %d", i)
		}
	}

	rs, err := s.ReservePut(ctx, &storepb.ReservePutRequest{ClientId: id, Specs: []*storepb.ReserveSpec{{Size: 4096, Config: two, Count: 3, Packed: true}}})
	require.NoError(t, err)
	res := rs.Results[0]
	require.NotNil(t, res.Packed)
	assert.Empty(t, res.Reservations)
	require.Len(t, res.PackedIds, 3)
	assert.EqualValues(t, 4096, res.PackedSize)
	reserved, err := res.Packed.Unpack(3)
	require.NoError(t, err)
	commit := &storepb.CommitPutRequest{ClientId: id}
	for j, rid := range res.PackedIds {
		commit.Items = append(commit.Items, &storepb.CommitItem{Key: "r" + string(rune('0'+j)), ReservationId: rid})
	}
	commit.Packed = true
	cr, err := s.CommitPut(ctx, commit)
	require.NoError(t, err)
	assert.Empty(t, cr.Results)
	co, err := cr.PackedResults.Unpack(3, false)
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 0, 0}, co.Codes)
	en, err := s.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: id, Keys: []string{"p0", "p2", "p3", "never"},
		Generations: []uint64{so.Values[0], so.Values[2], so.Values[3], 0}, Packed: true})
	require.NoError(t, err)
	assert.Empty(t, en.Results)
	eo, err := en.PackedResults.Unpack(4, false)
	require.NoError(t, err)
	assert.Equal(t, []int32{0, 0, 0, int32(errcode.ObjectNotFound)}, eo.Codes)

	all := []string{"p0", "p2", "p3", "r0", "r1", "r2", "missing"}
	placed := append([][]*storepb.ReplicaDescriptor{started[0], started[2], started[3]}, reserved...)
	plain, err := s.BatchGetReplicaList(ctx, &storepb.BatchGetReplicaListRequest{Keys: all})
	require.NoError(t, err)
	assert.Nil(t, plain.Packed, "not asked for")
	packed, err := s.BatchGetReplicaList(ctx, &storepb.BatchGetReplicaListRequest{Keys: all, Packed: true})
	require.NoError(t, err)
	got, err := packed.Packed.Unpack(len(all))
	require.NoError(t, err)
	assert.Empty(t, packed.Results)
	gets, err := packed.PackedResults.Unpack(len(all), true)
	require.NoError(t, err)
	for i, k := range all {
		want := plain.Results[i]
		assert.Equal(t, want.ErrorCode, gets.Codes[i], k)
		assert.Equal(t, want.Message, gets.Message(i), k)
		assert.Equal(t, want.LeaseTtlMs, gets.Values[i], k)
		require.Len(t, got[i], len(want.Replicas), k)
		for j := range want.Replicas {
			assert.True(t, proto.Equal(want.Replicas[j], got[i][j]), "%s replica %d: %v, want %v", k, j, got[i][j], want.Replicas[j])
		}
		if i < len(placed) {
			require.Len(t, placed[i], 2, k)
			for j, p := range placed[i] {
				assert.Equal(t, storepb.ReplicaStatus(master.StatusProcessing), p.Status, k)
				assert.True(t, proto.Equal(want.Replicas[j].Memory, p.Memory), "%s replica %d placed at %v, stored at %v", k, j, p.Memory, want.Replicas[j].Memory)
			}
		}
	}
	assert.EqualValues(t, errcode.ObjectNotFound, gets.Codes[len(all)-1])
}

// A reply with a replica that is not in memory goes unpacked.
func TestPackOnlyMemory(t *testing.T) {
	rs := [][]master.Replica{{{Type: master.Memory, SegmentName: "a"}}, {{Type: master.Disk}}}
	assert.Nil(t, packReplicas(len(rs), func(i int) []master.Replica { return rs[i] }))
	two := [][]master.Replica{rs[0], rs[0]}
	assert.NotNil(t, packReplicas(2, func(i int) []master.Replica { return two[i] }))
	res := reservationsPB(true, []master.Reservation{{ID: 1, Size: 8, Replicas: rs[1]}, {ID: 2, Size: 8, Replicas: rs[0]}})
	assert.Nil(t, res.Packed)
	require.Len(t, res.Reservations, 2)
	assert.EqualValues(t, 1, res.Reservations[0].Id)
}

// One entry goes unpacked: its columns would cost more than its messages
// (BenchmarkReserveReply).
func TestPackNotOne(t *testing.T) {
	one := []master.Replica{{Type: master.Memory, SegmentName: "a", Size: 8}}
	assert.Nil(t, packReplicas(1, func(int) []master.Replica { return one }))
	res := reservationsPB(true, []master.Reservation{{ID: 1, Size: 8, Replicas: one}})
	assert.Nil(t, res.Packed)
	require.Len(t, res.Reservations, 1)
	assert.NotNil(t, reservationsPB(true, []master.Reservation{{ID: 1, Size: 8, Replicas: one}, {ID: 2, Size: 8, Replicas: one}}).Packed)
	results, packed := itemsPB(true, []error{nil})
	assert.Nil(t, packed)
	assert.Len(t, results, 1)
	gone := errcode.New(errcode.ObjectNotFound, "gone")
	results, packed = itemsPB(true, []error{nil, gone})
	assert.Empty(t, results)
	require.NotNil(t, packed)
	assert.Equal(t, []int32{0, int32(errcode.ObjectNotFound)}, packed.Codes)
	assert.Equal(t, []string{gone.Error()}, packed.Messages)
}
