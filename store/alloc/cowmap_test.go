package alloc

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCowMapVersions: a version never sees its clone's writes, and a
// write copies only the shard it lands in.
func TestCowMapVersions(t *testing.T) {
	v1 := newCowMap[string, int](hashString)
	for i := range 1000 {
		v1.set(fmt.Sprint("k", i), i)
	}
	require.Equal(t, 1000, v1.len())
	v2 := v1.clone()
	v2.set("new", -1)
	v2.set("k7", 70)
	v2.del("k8")
	v2.del("absent")
	require.Equal(t, 1000, v2.len())

	for i := range 1000 {
		k := fmt.Sprint("k", i)
		v, ok := v1.get(k)
		require.True(t, ok, k)
		require.Equal(t, i, v, k)
	}
	_, ok := v1.get("new")
	require.False(t, ok)
	v, _ := v2.get("k7")
	require.Equal(t, 70, v)
	_, ok = v2.get("k8")
	require.False(t, ok)
	v, _ = v2.get("new")
	require.Equal(t, -1, v)

	written := map[int]bool{v2.at("new"): true, v2.at("k7"): true, v2.at("k8"): true}
	for i := range cowShards {
		same := reflect.ValueOf(v1.shard[i]).Pointer() == reflect.ValueOf(v2.shard[i]).Pointer()
		require.Equal(t, !written[i], same, "shard %d", i)
	}
}

// TestMountKeepsOldTable: a reader holding the table from before a mount
// and a release sees it as it was.
func TestMountKeepsOldTable(t *testing.T) {
	a := New(Random)
	for i := range 200 {
		mustMount(t, a, seg(i+1, fmt.Sprint("s", i), uint64(i%7+1), 1<<20))
	}
	before := a.tab.Load()
	extra := seg(500, "s3", 3, 1<<20) // a second segment named s3, elsewhere
	idx := mustMount(t, a, extra)
	_, err := a.Unmount(seg(4, "s3", 4, 1<<20).ID, nil)
	require.NoError(t, err)
	old, _ := a.Lookup(seg(4, "", 0, 0).ID)
	require.NoError(t, a.Release(old, nil))

	_, ok := before.byID.get(extra.ID)
	require.False(t, ok)
	require.Equal(t, 200, before.byID.len())
	require.Equal(t, []uint32{old}, before.name("s3"))
	require.NotContains(t, before.client(UUID{Lo: 4}), idx)

	now := a.tab.Load()
	require.Equal(t, 200, now.byID.len())
	require.Equal(t, []uint32{idx}, now.name("s3"))
	total, own := a.Counts(UUID{Lo: 4})
	require.Equal(t, 200, total)
	require.Len(t, a.ByClient(UUID{Lo: 4}), own)
	require.NotContains(t, a.ByClient(UUID{Lo: 4}), old)
}
