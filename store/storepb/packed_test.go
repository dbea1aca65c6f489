package storepb

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

func mem(seg, protocol string, hi, lo, addr, size uint64, st ReplicaStatus) *ReplicaDescriptor {
	return &ReplicaDescriptor{Type: ReplicaType_REPLICA_TYPE_MEMORY, Status: st, Memory: &MemoryDescriptor{
		SegmentName: seg, Protocol: protocol, SegmentId: &UUID{High: hi, Low: lo}, BufferAddress: addr, Size: size}}
}

// A packed list survives the wire and unpacks to the descriptors it was
// built from, entry by entry, empty entries included.
func TestPackRoundTrip(t *testing.T) {
	pro, done := ReplicaStatus_REPLICA_STATUS_PROCESSING, ReplicaStatus_REPLICA_STATUS_COMPLETE
	want := [][]*ReplicaDescriptor{
		{mem("a:1", "tcp", 1, 1, 100, 4096, pro), mem("b:1", "tcp", 1, 2, 200, 4096, pro)},
		nil,
		{mem("a:1", "tcp", 1, 1, 8192, 4096, done)},
		// Same name, other id: another segment.
		{mem("a:1", "tcp", 1, 3, 0, 1, pro), mem("b:1", "rdma", 1, 2, 7, 8, pro), mem("b:1", "tcp", 1, 2, 9, 10, pro)},
	}
	k := NewPacker(len(want), 6)
	for _, e := range want {
		for _, r := range e {
			m := r.Memory
			k.Add(m.SegmentName, m.Protocol, m.SegmentId.High, m.SegmentId.Low, m.BufferAddress, m.Size, r.Status)
		}
		k.End()
	}
	b, err := proto.Marshal(k.Packed())
	require.NoError(t, err)
	var p PackedReplicas
	require.NoError(t, proto.Unmarshal(b, &p))
	assert.Len(t, p.Segments, 4, "each distinct segment once")
	got, err := p.Unpack(len(want))
	require.NoError(t, err)
	require.Len(t, got, len(want))
	for e := range want {
		require.Len(t, got[e], len(want[e]), "entry %d", e)
		for i := range want[e] {
			assert.True(t, proto.Equal(want[e][i], got[e][i]), "entry %d replica %d: %v, want %v", e, i, got[e][i], want[e][i])
		}
	}
	// An entry's slice cannot grow into the next entry's replicas.
	assert.Equal(t, len(got[0]), cap(got[0]))
}

// Packed lists that do not add up are refused with an error, never a
// panic or a descriptor read out of range.
func TestUnpackRefusesMalformed(t *testing.T) {
	seg := []*MemorySegment{{Name: "a:1", Id: &UUID{Low: 1}}}
	ok := func() *PackedReplicas {
		return &PackedReplicas{Segments: seg, Counts: []uint32{1, 1}, Segment: []uint32{0, 0},
			Address: []uint64{1, 2}, Size: []uint64{3, 4}, Status: []ReplicaStatus{0, 0}}
	}
	_, err := ok().Unpack(2)
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		mutate  func(*PackedReplicas)
		entries int
	}{
		"fewer entries":       {func(*PackedReplicas) {}, 3},
		"counts past columns": {func(p *PackedReplicas) { p.Counts[1] = 1 << 31 }, 2},
		"counts short":        {func(p *PackedReplicas) { p.Counts[1] = 0 }, 2},
		"a short column":      {func(p *PackedReplicas) { p.Size = p.Size[:1] }, 2},
		"no status":           {func(p *PackedReplicas) { p.Status = nil }, 2},
		"unknown segment":     {func(p *PackedReplicas) { p.Segment[1] = 1 }, 2},
		"nil segment":         {func(p *PackedReplicas) { p.Segments = []*MemorySegment{nil} }, 2},
		"nil list":            {func(p *PackedReplicas) { *p = PackedReplicas{} }, 2},
	} {
		p := ok()
		tc.mutate(p)
		_, err := p.Unpack(tc.entries)
		assert.Error(t, err, name)
	}
	var none *PackedReplicas
	_, err = none.Unpack(1)
	assert.Error(t, err, "a nil list has no entry")
}

// FuzzUnpack: whatever bytes arrive, Unpack errs or returns descriptors
// within the columns it was given.
func FuzzUnpack(f *testing.F) {
	k := NewPacker(2, 2)
	k.Add("a:1", "tcp", 1, 2, 3, 4, ReplicaStatus_REPLICA_STATUS_PROCESSING)
	k.End()
	k.Add("b:1", "tcp", 1, 3, 5, 6, ReplicaStatus_REPLICA_STATUS_PROCESSING)
	k.End()
	b, _ := proto.Marshal(k.Packed())
	f.Add(b, 2)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, b []byte, entries int) {
		if entries < 0 || entries > 1<<16 {
			return
		}
		var p PackedReplicas
		if proto.Unmarshal(b, &p) != nil {
			return
		}
		got, err := p.Unpack(entries)
		if err != nil {
			return
		}
		n := 0
		for _, e := range got {
			n += len(e)
			for _, r := range e {
				require.NotNil(t, r.Memory)
			}
		}
		require.Equal(t, len(p.Address), n)
	})
}

// A nil list holds zero entries.
func TestUnpackNil(t *testing.T) {
	var none *PackedReplicas
	got, err := none.Unpack(0)
	require.NoError(t, err)
	assert.Empty(t, got)
}
