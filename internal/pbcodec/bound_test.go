package pbcodec

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestUnmarshalRequestBounded: requests of empty messages (two bytes on
// the wire, a struct decoded) are refused before they are decoded,
// allocating less than they weigh, while Unmarshal would take more than
// the budget (checked for one of them).
func TestUnmarshalRequestBounded(t *testing.T) {
	const n = 3 << 19 // 3 MiB of requests
	for name, tc := range map[string]struct {
		b []byte
		m proto.Message
	}{
		"blocks":   {testutil.EmptyMessages(4, n), &storepb.BatchPutEndRequest{}},
		"items":    {testutil.EmptyMessages(2, n), &storepb.CommitPutRequest{}},
		"segments": {testutil.EmptyMessages(2, n), &storepb.ReMountSegmentRequest{}},
		"nested":   {append(testutil.EmptyMessages(2, n/2), testutil.EmptyMessages(3, n/2)...), &storepb.CommitPutRequest{}},
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			alloc := testutil.Allocated(func() { err = UnmarshalRequest(tc.b, tc.m) })
			require.ErrorIs(t, err, ErrExpansion)
			assert.Less(t, alloc, uint64(len(tc.b)), "refused after decoding")

			if name != "segments" {
				return // decoding each would take 100-200 MB more
			}
			alloc = testutil.Allocated(func() { err = Unmarshal(tc.b, tc.m) })
			require.NoError(t, err)
			t.Logf("%d bytes decode to %d allocated", len(tc.b), alloc)
			assert.Greater(t, alloc, uint64(max(MaxExpansion*len(tc.b), MinDecodeBudget)))
		})
	}
}

// TestUnmarshalRequestRealBatches: large requests of the sizes the store
// client sends pass the check and decode as Unmarshal does.
func TestUnmarshalRequestRealBatches(t *testing.T) {
	const items = 10000
	start := &storepb.BatchPutStartRequest{ClientId: &storepb.UUID{High: 1}, Config: &storepb.ReplicateConfig{ReplicaNum: 1}}
	end := &storepb.BatchPutEndRequest{ClientId: &storepb.UUID{High: 1}}
	commit := &storepb.CommitPutRequest{ClientId: &storepb.UUID{High: 1}}
	short := &storepb.CommitPutRequest{ClientId: &storepb.UUID{High: 1}}
	bare := &storepb.CommitPutRequest{ClientId: &storepb.UUID{High: 1}} // blocks with a size only: about 9x
	for i := range items {
		k := fmt.Sprintf("model-7b/layer-%02d/block-%016x", i%32, i*7919)
		start.Keys = append(start.Keys, k)
		start.Sizes = append(start.Sizes, 1<<20)
		blk := &storepb.BlockMetadata{BlockHashes: []uint64{uint64(i) * 0x9e3779b97f4a7c15}, BlockSize: 16}
		for j := range 16 {
			blk.TokenIds = append(blk.TokenIds, uint32(i*16+j)%151000)
		}
		end.Keys = append(end.Keys, k)
		end.Blocks = append(end.Blocks, blk)
		end.Generations = append(end.Generations, uint64(i+1))
		commit.Items = append(commit.Items, &storepb.CommitItem{Key: k, ReservationId: uint64(i + 1), Block: blk})
		short.Items = append(short.Items, &storepb.CommitItem{Key: fmt.Sprintf("k%d", i), ReservationId: uint64(i + 1)})
		bare.Items = append(bare.Items, &storepb.CommitItem{Key: fmt.Sprintf("key-%011d", i), ReservationId: uint64(i + 1), Block: &storepb.BlockMetadata{BlockSize: 16}})
	}
	for name, m := range map[string]proto.Message{"start": start, "end": end, "commit": commit, "short keys": short, "bare blocks": bare} {
		t.Run(name, func(t *testing.T) {
			b, err := Marshal(m)
			require.NoError(t, err)
			est, err := decodedSize(b, m.ProtoReflect().Descriptor(), 0)
			require.NoError(t, err)
			t.Logf("%d bytes, estimated %d (%.1fx)", len(b), est, float64(est)/float64(len(b)))
			got := m.ProtoReflect().New().Interface()
			var uerr error
			alloc := testutil.Allocated(func() { uerr = UnmarshalRequest(b, got) })
			require.NoError(t, uerr)
			t.Logf("decoded with %d allocated (%.1fx)", alloc, float64(alloc)/float64(len(b)))
			require.True(t, proto.Equal(m, got))
		})
	}
}
