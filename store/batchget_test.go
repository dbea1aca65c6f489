package store

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestBatchGetInto: BatchGetInto reads every item into its buffer, with no
// staging when the buffers are registered, and answers per item: sizes,
// a short buffer (BUFFER_OVERFLOW), a missing key; mismatched lengths
// refuse every item.
func TestBatchGetInto(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 0, protocols("tcp")) // pure client: every replica is remote
	newTestClient(t, tm, 64<<20, protocols("tcp"))
	ctx := tctx(t)
	const n, size = 8, 5000
	mem := registered(t, a, n*size)
	var keys []string
	var vals, dsts [][]byte
	for i := range n {
		keys = append(keys, fmt.Sprint("bgi-", i))
		vals = append(vals, testutil.Bytes(size-i, uint64(40+i)))
		dsts = append(dsts, mem[i*size:(i+1)*size])
	}
	for i, err := range a.BatchPut(ctx, keys, vals, ReplicateConfig{}) {
		require.NoError(t, err, "put %d", i)
	}
	staged := a.Stats().StagedBytes
	ns, errs := a.BatchGetInto(ctx, keys, dsts)
	for i := range n {
		require.NoError(t, errs[i], "item %d", i)
		require.Equal(t, size-i, ns[i])
		require.Equal(t, vals[i], dsts[i][:ns[i]])
	}
	require.Equal(t, staged, a.Stats().StagedBytes, "registered buffers staged bytes")
	// Heap buffers go through staging, with the same result; a short
	// buffer and a missing key fail alone.
	heap := [][]byte{make([]byte, size), make([]byte, 10), make([]byte, size)}
	ns, errs = a.BatchGetInto(ctx, []string{keys[1], keys[2], "missing"}, heap)
	require.NoError(t, errs[0])
	require.Equal(t, vals[1], heap[0][:ns[0]])
	require.ErrorIs(t, errs[1], errcode.ErrBufferOverflow)
	require.Zero(t, ns[1])
	require.ErrorIs(t, errs[2], errcode.ErrObjectNotFound)
	_, errs = a.BatchGetInto(ctx, keys, dsts[:1])
	for _, err := range errs {
		require.ErrorIs(t, err, errcode.ErrInvalidParams)
	}
}

// TestBatchGetAllocs holds what a BatchGet of 16 values over shm
// allocates in the client, with the values read straight into registered
// buffers and through staging: the batch takes its per-item state (replica
// orders, transfers) in a few arrays, not a map and an allocation per item,
// and staging frees make no channel. The values still arrive intact.
func TestBatchGetAllocs(t *testing.T) {
	const batch, size = 16, 4 << 10
	a, s, _ := benchPair(t, "shm")
	ctx := tctx(t)
	src := benchBuffer(t, a, batch*size)
	dst := benchBuffer(t, a, batch*size)
	keys := make([]string, batch)
	vals := make([][]byte, batch)
	dsts := make([][]byte, batch)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
		vals[i] = src[i*size : (i+1)*size]
		for j := range vals[i] {
			vals[i][j] = byte(i + j)
		}
		dsts[i] = dst[i*size : (i+1)*size]
	}
	for _, err := range a.BatchPut(ctx, keys, vals, ReplicateConfig{Preferred: []string{s.SegmentName()}}) {
		require.NoError(t, err)
	}
	var failed []error // checked after the counts (testify allocates)
	collect := func(errs []error) {
		for _, err := range errs {
			if err != nil {
				failed = append(failed, err)
			}
		}
	}
	into := testing.AllocsPerRun(50, func() {
		clear(dst)
		_, errs := a.BatchGetInto(ctx, keys, dsts)
		collect(errs)
	})
	require.Empty(t, failed)
	for i := range keys {
		require.True(t, bytes.Equal(vals[i], dsts[i]), "value %d", i)
	}
	var got [][]byte
	staged := testing.AllocsPerRun(50, func() {
		var errs []error
		got, errs = a.BatchGet(ctx, keys)
		collect(errs)
	})
	require.Empty(t, failed)
	for i := range keys {
		require.True(t, bytes.Equal(vals[i], got[i]), "value %d", i)
	}
	t.Logf("allocations per batch of %d: %.0f into registered buffers, %.0f staged (values included)", batch, into, staged)
	// 141 and 172 with a map and an xfer per item and a channel per
	// staging free.
	require.LessOrEqual(t, into, 115.0)
	require.LessOrEqual(t, staged, 135.0)
}

// TestBatchPastMaxItems: batches of more keys than the master takes in
// one RPC (storepb.MaxBatchItems) go in pieces and answer every item in
// order: put, get, exist, remove.
func TestBatchPastMaxItems(t *testing.T) {
	tm := startMaster(t, master.Config{})
	a := newTestClient(t, tm, 64<<20, protocols("tcp"))
	ctx := tctx(t)
	n := storepb.MaxBatchItems + 3
	keys := make([]string, n)
	vals := make([][]byte, n)
	for i := range n {
		keys[i] = fmt.Sprint("many-", i)
		vals[i] = []byte(keys[i])
	}
	for i, err := range a.BatchPut(ctx, keys, vals, ReplicateConfig{}) {
		require.NoError(t, err, "put %d", i)
	}
	got, errs := a.BatchGet(ctx, keys)
	for i := range n {
		require.NoError(t, errs[i], "get %d", i)
		require.Equal(t, vals[i], got[i], "get %d", i)
	}
	// The last key is missing: answered in its place.
	probe := append(slices.Clone(keys[:n-1]), "missing")
	found, errs := a.BatchIsExist(ctx, probe)
	for i := range n {
		require.NoError(t, errs[i], "exist %d", i)
		require.Equal(t, i < n-1, found[i], "exist %d", i)
	}
	errs = a.BatchRemove(ctx, probe, true) // the gets hold leases
	for i := range n - 1 {
		require.NoError(t, errs[i], "remove %d", i)
	}
	require.ErrorIs(t, errs[n-1], errcode.ErrObjectNotFound)
	found, _ = a.BatchIsExist(ctx, keys)
	require.Equal(t, n-1, slices.Index(found, true), "only the key not removed remains")
}
