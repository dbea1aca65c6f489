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
// within the columns it was given (and packed results, their items).
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
		// The same bytes as packed results.
		var r PackedResults
		if proto.Unmarshal(b, &r) == nil {
			if o, err := r.Unpack(entries, entries%2 == 0); err == nil {
				require.Len(t, o.Codes, entries)
				for i := range entries {
					_ = o.Message(i)
				}
			}
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

// Packed results carry each item's code, the failed items' messages and
// the per-item numbers, and unpack to them.
func TestPackResultsRoundTrip(t *testing.T) {
	codes := []int32{0, 7, 0, 9}
	msgs := []string{"", "seven", "", "nine"}
	p := PackResults(len(codes), func(i int) (int32, string) { return codes[i], msgs[i] }, func(i int) uint64 { return uint64(10 + i) })
	assert.Equal(t, []string{"seven", "nine"}, p.Messages, "only the failed items' messages travel")
	b, err := proto.Marshal(p)
	require.NoError(t, err)
	var q PackedResults
	require.NoError(t, proto.Unmarshal(b, &q))
	o, err := q.Unpack(len(codes), true)
	require.NoError(t, err)
	assert.Equal(t, codes, o.Codes)
	assert.Equal(t, []uint64{10, 11, 12, 13}, o.Values)
	for i := range codes {
		assert.Equal(t, msgs[i], o.Message(i))
	}
	none := PackResults(2, func(int) (int32, string) { return 0, "" }, nil)
	o, err = none.Unpack(2, false)
	require.NoError(t, err)
	assert.Empty(t, o.Values)
	assert.Empty(t, o.Message(1))
}

// Packed results that do not match their items are refused.
func TestUnpackResultsRefusesMalformed(t *testing.T) {
	ok := func() *PackedResults {
		return &PackedResults{Codes: []int32{0, 3}, Messages: []string{"three"}, Values: []uint64{1, 2}}
	}
	_, err := ok().Unpack(2, true)
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		mutate func(*PackedResults)
		n      int
		values bool
	}{
		"fewer items":           {func(*PackedResults) {}, 3, true},
		"values missing":        {func(p *PackedResults) { p.Values = nil }, 2, true},
		"values not expected":   {func(*PackedResults) {}, 2, false},
		"a message too many":    {func(p *PackedResults) { p.Messages = append(p.Messages, "x") }, 2, true},
		"a failure unexplained": {func(p *PackedResults) { p.Codes[0] = 1 }, 2, true},
	} {
		p := ok()
		tc.mutate(p)
		_, err := p.Unpack(tc.n, tc.values)
		assert.Error(t, err, name)
	}
	var none *PackedResults
	_, err = none.Unpack(1, false)
	assert.Error(t, err)
}

// Nil packed results hold zero items.
func TestUnpackResultsNil(t *testing.T) {
	var none *PackedResults
	o, err := none.Unpack(0, false)
	require.NoError(t, err)
	assert.Empty(t, o.Codes)
}
