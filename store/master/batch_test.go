package master

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBatchPutAllocs holds the allocations per key of BatchPutStart +
// BatchPutEnd (GC was 12% of the master's CPU in --operation meta): the
// batch allocates its ops and replica descriptions once, not per item.
func TestBatchPutAllocs(t *testing.T) {
	const batch = 128
	m := benchMaster(t, 4)
	sizes := make([]uint64, batch)
	for i := range sizes {
		sizes[i] = 4096
	}
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
	require.Empty(t, failed)
	for r := range keys {
		for i := range batch {
			require.NoError(t, starts[r][i].Err)
			require.Len(t, starts[r][i].Replicas, 1)
			require.NoError(t, ends[r][i])
		}
	}
	perKey := allocs / batch
	t.Logf("%.2f allocations per key", perKey)
	require.LessOrEqual(t, perKey, 4.5)
	for r := range keys {
		for _, k := range keys[r] {
			reps, _, err := m.GetReplicaList(k)
			require.NoError(t, err, k)
			require.Len(t, reps, 1)
		}
	}
}
