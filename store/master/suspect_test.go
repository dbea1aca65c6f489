package master

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/errcode"
)

// onSegments counts the replicas of reps on each segment name.
func onSegments(reps []Replica, count map[string]int) {
	for _, r := range reps {
		count[r.SegmentName]++
	}
}

// TestReportFailedSegments: a reported segment takes no new replicas
// while others can, keeps what it stores, and is cleared by its owner's
// Ping (only the owner's).
func TestReportFailedSegments(t *testing.T) {
	e := newEnv(t, nil)
	w, d := cl(1), cl(2) // the writer and the client that died
	e.mount(w, "w:1", 64<<20)
	sd := e.mount(d, "d:1", 64<<20)
	before := map[string]int{}
	for i := range 40 {
		onSegments(e.put(w, fmt.Sprintf("before-%d", i), 4096, ReplicateConfig{}), before)
	}
	require.Positive(t, before["d:1"], "placement never chose the second segment: the test proves nothing")

	n, err := e.m.ReportFailedSegments(w, []UUID{sd.ID})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	n, err = e.m.ReportFailedSegments(w, []UUID{sd.ID}) // again: no change
	require.NoError(t, err)
	assert.Equal(t, 0, n)
	st := e.m.Stats()
	assert.Equal(t, 1, st.SuspectSegments)
	assert.Equal(t, uint64(2), st.SegmentReports)
	for _, s := range e.m.AllSegments() {
		assert.Equal(t, s.Name == "d:1", s.Suspect, s.Name)
	}

	after := map[string]int{}
	for i := range 40 {
		onSegments(e.put(w, fmt.Sprintf("after-%d", i), 4096, ReplicateConfig{}), after)
		onSegments(e.put(w, fmt.Sprintf("after2-%d", i), 4096, ReplicateConfig{Replicas: 2}), after)
		res := e.m.Reserve(w, ReserveSpec{Size: 4096, Count: 1})
		require.NoError(t, res.Err)
		onSegments(res.Reservations[0].Replicas, after)
	}
	assert.Equal(t, map[string]int{"w:1": 120}, after, "replicas placed while d:1 is suspect")
	// A minimum the others cannot meet takes the suspect segment.
	onSegments(e.put(w, "min2", 4096, ReplicateConfig{Replicas: 2, MinReplicas: 2}), after)
	assert.Equal(t, 1, after["d:1"])

	// Nothing stored is touched.
	for i := range 40 {
		_, _, err := e.m.GetReplicaList(fmt.Sprintf("before-%d", i))
		require.NoError(t, err)
	}

	// Only the owner's Ping clears the flag.
	e.m.Ping(w)
	assert.Equal(t, 1, e.m.Stats().SuspectSegments)
	e.m.Ping(d)
	assert.Equal(t, 0, e.m.Stats().SuspectSegments)
	again := map[string]int{}
	for i := range 40 {
		onSegments(e.put(w, fmt.Sprintf("again-%d", i), 4096, ReplicateConfig{}), again)
	}
	assert.Positive(t, again["d:1"], "the cleared segment takes replicas again")
}

// TestReportFailedSegmentsHostile: a report never blocks puts that have
// nowhere else to go, ignores the reporter's own and unknown segments,
// and is bounded.
func TestReportFailedSegmentsHostile(t *testing.T) {
	e := newEnv(t, nil)
	a, b, liar := cl(1), cl(2), cl(3)
	sa := e.mount(a, "a:1", 64<<20)
	sb := e.mount(b, "b:1", 64<<20)

	n, err := e.m.ReportFailedSegments(a, []UUID{sa.ID, {Hi: 9, Lo: 9}})
	require.NoError(t, err)
	assert.Zero(t, n, "own and unknown segments")
	n, err = e.m.ReportFailedSegments(liar, []UUID{sa.ID, sb.ID})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	// Every segment suspect: puts still land (the report may be false).
	e.put(liar, "k", 4096, ReplicateConfig{})

	_, err = e.m.ReportFailedSegments(liar, make([]UUID, MaxReportSegments+1))
	assert.ErrorIs(t, err, errcode.ErrInvalidParams)
	_, err = e.m.ReportFailedSegments(UUID{}, []UUID{sa.ID})
	assert.ErrorIs(t, err, errcode.ErrInvalidParams)

	// An unmounted segment's flag goes with it.
	require.NoError(t, e.m.UnmountSegment(b, sb.ID))
	assert.Equal(t, 1, e.m.Stats().SuspectSegments)
	e.m.Ping(a)
	assert.Equal(t, 0, e.m.Stats().SuspectSegments)
}

// TestMinReplicas: a put that cannot place MinReplicas fails and places
// nothing (and evicts nothing); one that can stores what fits.
func TestMinReplicas(t *testing.T) {
	e := newEnv(t, nil)
	c := cl(1)
	e.mount(c, "a:1", 64<<20)
	_, err := e.m.PutStart(c, "k", 4096, ReplicateConfig{Replicas: 2, MinReplicas: 2})
	require.ErrorIs(t, err, errcode.ErrNoAvailableHandle)
	assert.Contains(t, err.Error(), "2 replicas required")
	st := e.m.Stats()
	assert.Zero(t, st.Keys)
	assert.Zero(t, st.Allocated)
	assert.Zero(t, st.EvictionRuns)
	res, err := e.m.BatchPutStart(c, []string{"b"}, []uint64{4096}, ReplicateConfig{Replicas: 2, MinReplicas: 2})
	require.NoError(t, err)
	assert.ErrorIs(t, res[0].Err, errcode.ErrNoAvailableHandle)
	assert.ErrorIs(t, e.m.Reserve(c, ReserveSpec{Size: 4096, Count: 1, Config: ReplicateConfig{Replicas: 2, MinReplicas: 2}}).Err,
		errcode.ErrNoAvailableHandle)
	assert.Zero(t, e.m.Stats().Allocated)

	for _, bad := range []ReplicateConfig{{Replicas: 2, MinReplicas: 3}, {MinReplicas: 2}, {MinReplicas: -1}} {
		_, err := e.m.PutStart(c, "k", 4096, bad)
		assert.ErrorIs(t, err, errcode.ErrInvalidParams, "%+v", bad)
	}
	assert.Len(t, e.put(c, "one", 4096, ReplicateConfig{Replicas: 2, MinReplicas: 1}), 1)
	e.mount(cl(2), "b:1", 64<<20)
	assert.Len(t, e.put(c, "two", 4096, ReplicateConfig{Replicas: 2, MinReplicas: 2}), 2)
}

// TestSuspectEvictsFirst: when the healthy segments are full, a put makes
// room there before it falls back on a suspect segment.
func TestSuspectEvictsFirst(t *testing.T) {
	e := newEnv(t, nil)
	w, d := cl(1), cl(2)
	e.mount(w, "w:1", 1<<20)
	for i := 0; e.m.Stats().Allocated < 1<<20; i++ {
		require.Less(t, i, 16)
		e.put(w, fmt.Sprintf("fill-%d", i), 64<<10, ReplicateConfig{})
	}
	require.Zero(t, e.m.Stats().EvictedKeys)
	evicted := e.m.Stats().EvictedKeys
	sd := e.mount(d, "d:1", 1<<20)
	_, err := e.m.ReportFailedSegments(w, []UUID{sd.ID})
	require.NoError(t, err)
	reps := e.put(w, "k", 64<<10, ReplicateConfig{})
	require.Len(t, reps, 1)
	assert.Equal(t, "w:1", reps[0].SegmentName)
	assert.Greater(t, e.m.Stats().EvictedKeys, evicted)
}
