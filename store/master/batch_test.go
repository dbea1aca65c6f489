package master

import (
	"fmt"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBatchPutAllocs holds the allocations per key of BatchPutStart +
// BatchPutEnd (GC was 12% of the master's CPU in --operation meta): the
// batch allocates its ops and replica descriptions once, not per item.
func TestBatchPutAllocs(t *testing.T) {
	const batch = 128
	m := benchMaster(t, 4)
	sizes := slices.Repeat([]uint64{4096}, batch)
	// Past the first growths of the shards and the node tables, which
	// are amortised over many keys.
	for i := range 100_000 / batch {
		ks := make([]string, batch)
		for j := range ks {
			ks[j] = blockKey(nil, 1<<30+i*batch+j)
		}
		_, err := m.BatchPutStart(cl(1), ks, sizes, ReplicateConfig{})
		require.NoError(t, err)
		_, err = m.BatchPutEnd(cl(1), ks, Memory, nil)
		require.NoError(t, err)
	}
	const runs = 20
	keys := make([][]string, runs+1) // AllocsPerRun runs once more to warm up
	for r := range keys {
		keys[r] = make([]string, batch)
		for i := range batch {
			keys[r][i] = blockKey(nil, r*batch+i)
		}
	}
	// Checked after the count (testify allocates).
	starts := make([][]PutStartResult, 0, len(keys))
	ends := make([][]error, 0, len(keys))
	var failed []error
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	allocs := testing.AllocsPerRun(runs, func() {
		ks := keys[len(starts)]
		res, err := m.BatchPutStart(cl(1), ks, sizes, ReplicateConfig{})
		starts = append(starts, res)
		errs, err2 := m.BatchPutEnd(cl(1), ks, Memory, nil)
		ends = append(ends, errs)
		if err != nil || err2 != nil {
			failed = append(failed, err, err2)
		}
	})
	runtime.ReadMemStats(&ms1)
	require.Empty(t, failed)
	for r := range keys {
		for i := range batch {
			require.NoError(t, starts[r][i].Err)
			require.Len(t, starts[r][i].Replicas, 1)
			require.NoError(t, ends[r][i])
		}
	}
	perKey := allocs / batch
	bytesPerKey := float64(ms1.TotalAlloc-ms0.TotalAlloc) / float64((runs+1)*batch)
	t.Logf("%.2f allocations, %.0f bytes per key", perKey, bytesPerKey)
	require.LessOrEqual(t, perKey, 1.5)
	// Without an OpSink no op outlives its item: one op serves the batch
	// (per-item ops were 2 x 160 bytes a key: 850 in all).
	require.LessOrEqual(t, bytesPerKey, 650.0)
	for r := range keys {
		for _, k := range keys[r] {
			reps, _, err := m.GetReplicaList(k)
			require.NoError(t, err, k)
			require.Len(t, reps, 1)
		}
	}
}

// TestBatchPutOpsOwnTheirBuffers: the ops a batch logs share the batch's
// buffers but never each other's elements: with 2 replicas, failing items
// (bad size, existing key) between good ones, every logged op's segments
// and addresses are its own replicas', and replaying the log reproduces
// the master.
func TestBatchPutOpsOwnTheirBuffers(t *testing.T) {
	e := newEnv(t, nil)
	for i := range 3 {
		e.mount(cl(uint64(i+1)), fmt.Sprint("seg", i), 1<<30)
	}
	e.put(cl(1), "k003", 4096, ReplicateConfig{})
	keys := make([]string, 40)
	sizes := make([]uint64, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("k%03d", i)
		sizes[i] = uint64(4096 * (i + 1))
	}
	sizes[7] = 0
	rc := ReplicateConfig{Replicas: 2}
	res, err := e.m.BatchPutStart(cl(1), keys, sizes, rc)
	require.NoError(t, err)
	byKey := map[string][]Replica{}
	for i, r := range res {
		if i == 3 || i == 7 {
			require.Error(t, r.Err, keys[i])
			continue
		}
		require.NoError(t, r.Err, keys[i])
		require.Len(t, r.Replicas, 2)
		require.Equal(t, 2, cap(r.Replicas), "an item's replicas are clipped")
		byKey[keys[i]] = r.Replicas
	}
	errs, err := e.m.BatchPutEnd(cl(1), keys, Memory, nil)
	require.NoError(t, err)
	for i, x := range errs {
		if i != 3 && i != 7 {
			require.NoError(t, x, keys[i])
		}
	}
	starts := 0
	for _, op := range e.log.all() {
		reps, ok := byKey[op.Key]
		if op.Kind != OpPutStart || !ok {
			continue
		}
		starts++
		require.Len(t, op.Addrs, 2, op.Key)
		require.Len(t, op.Segments, 2, op.Key)
		for j, r := range reps {
			require.Equal(t, r.Addr, op.Addrs[j], op.Key)
			require.Equal(t, r.Size, op.Size, op.Key)
		}
	}
	require.Equal(t, len(byKey), starts)
	standby, err := New(Config{Shards: 3, Clock: e.clk, Seed: 99})
	require.NoError(t, err)
	defer standby.Close()
	for _, op := range e.log.all() {
		require.NoError(t, standby.Replay(op), op.Key)
	}
	require.Empty(t, diffState(dumpState(e.m), dumpState(standby)))
}

// TestBatchBuffers: a caller that keeps its BatchBuffers gets the same
// results from BatchPutStartInto and BatchGetReplicaListInto as without
// them, in the same arrays each time, and Reset drops what a batch left
// behind.
func TestBatchBuffers(t *testing.T) {
	const batch = 64
	m := benchMaster(t, 4)
	sizes := slices.Repeat([]uint64{4096}, batch)
	keys := func(base int) []string {
		ks := make([]string, batch)
		for i := range ks {
			ks[i] = blockKey(nil, base+i)
		}
		return ks
	}
	var bufs BatchBuffers
	seen := map[uint64]bool{}
	for r := range 3 {
		res, err := m.BatchPutStartInto(cl(1), keys(r*batch), sizes, ReplicateConfig{}, &bufs)
		require.NoError(t, err)
		require.Len(t, res, batch)
		for _, x := range res {
			require.NoError(t, x.Err)
			require.Len(t, x.Replicas, 1)
			require.Equal(t, uint64(4096), x.Replicas[0].Size)
			require.False(t, seen[x.Replicas[0].Addr], "address handed out twice")
			seen[x.Replicas[0].Addr] = true
		}
		bufs.Reset()
	}
	require.LessOrEqual(t, bufs.Cap(), 2*batch)

	// An item that fails leaves its error in the buffers until Reset.
	sz := append([]uint64{0}, sizes[1:]...)
	res, err := m.BatchPutStartInto(cl(1), keys(10*batch), sz, ReplicateConfig{}, &bufs)
	require.NoError(t, err)
	require.Error(t, res[0].Err)
	require.NoError(t, res[1].Err)
	bufs.Reset()
	require.Empty(t, bufs.puts)
	require.Empty(t, bufs.replicas)
	require.Nil(t, bufs.puts[:1][0].Err, "Reset keeps an error reachable")
	require.Empty(t, bufs.replicas[:1][0].SegmentName, "Reset keeps a segment name reachable")

	// The arrays are reused: the next batch's results and replicas live
	// where the last one's did.
	a, err := m.BatchPutStartInto(cl(1), keys(20*batch), sizes, ReplicateConfig{}, &bufs)
	require.NoError(t, err)
	ra := &a[0].Replicas[0]
	bufs.Reset()
	b, err := m.BatchPutStartInto(cl(1), keys(21*batch), sizes, ReplicateConfig{}, &bufs)
	require.NoError(t, err)
	require.Same(t, &a[0], &b[0])
	require.Same(t, ra, &b[0].Replicas[0])

	// Without buffers every call has its own arrays.
	c, err := m.BatchPutStart(cl(1), keys(22*batch), sizes, ReplicateConfig{})
	require.NoError(t, err)
	d, err := m.BatchPutStart(cl(1), keys(23*batch), sizes, ReplicateConfig{})
	require.NoError(t, err)
	require.NotSame(t, &c[0], &d[0])
	require.NotSame(t, &c[0].Replicas[0], &d[0].Replicas[0])

	// Reads: the same answers as one GetReplicaList per key, a missing
	// key's error in its own slot, the arrays reused.
	ks := keys(20 * batch)
	_, err = m.BatchPutEnd(cl(1), ks, Memory, nil)
	require.NoError(t, err)
	ks[3] = "missing"
	g1 := m.BatchGetReplicaListInto(ks, &bufs)
	require.Len(t, g1, batch)
	rg := &g1[0].Replicas[0]
	for i, k := range ks {
		want, ttl, err := m.GetReplicaList(k)
		if i == 3 {
			require.Error(t, err)
			require.ErrorIs(t, g1[i].Err, err)
			continue
		}
		require.NoError(t, g1[i].Err)
		require.Equal(t, want, g1[i].Replicas)
		require.Equal(t, ttl, g1[i].LeaseTTL)
		require.Equal(t, StatusComplete, g1[i].Replicas[0].Status)
	}
	require.Equal(t, b[0].Replicas[0].Addr, g1[0].Replicas[0].Addr)
	bufs.Reset()
	require.Nil(t, bufs.gets[:4][3].Err, "Reset keeps an error reachable")
	g2 := m.BatchGetReplicaListInto(ks, &bufs)
	require.Same(t, &g1[0], &g2[0])
	require.Same(t, rg, &g2[0].Replicas[0])
	fresh := m.BatchGetReplicaList(ks)
	require.NotSame(t, &fresh[0], &g2[0])
	require.Equal(t, g2[5].Replicas, fresh[5].Replicas)
}
