package alloc

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/errcode"
)

// TestSuspect: Choose avoids suspect segments unless MinReplicas needs
// them (never with NoSuspect); the owner's ClearSuspect and Release end
// the flag.
func TestSuspect(t *testing.T) {
	for _, st := range []Strategy{Random, FreeRatioFirst, LocalFirst} {
		t.Run(st.String(), func(t *testing.T) {
			a := New(st, WithRand(1))
			ia := mustMount(t, a, seg(1, "a", 1, 1<<20))
			ib := mustMount(t, a, seg(2, "b", 2, 1<<20))
			owner, changed, ok := a.MarkSuspect(seg(2, "b", 2, 0).ID)
			require.True(t, ok)
			assert.True(t, changed)
			assert.Equal(t, UUID{Lo: 2}, owner)
			_, changed, _ = a.MarkSuspect(seg(2, "b", 2, 0).ID)
			assert.False(t, changed)
			_, _, ok = a.MarkSuspect(UUID{Hi: 9})
			assert.False(t, ok)
			assert.Equal(t, 1, a.Suspects())
			assert.Equal(t, 1, a.Placeable(false))
			assert.Equal(t, 2, a.Placeable(true))
			stat, _ := a.Stat(ib)
			assert.True(t, stat.Suspect)

			for range 20 {
				got, err := a.Choose(Request{Size: 100, Replicas: 2, Preferred: []string{"b"}, Local: UUID{Lo: 2}})
				require.NoError(t, err)
				assert.Equal(t, []uint32{ia}, got)
			}
			got, err := a.Choose(Request{Size: 100, Replicas: 2, MinReplicas: 2})
			require.NoError(t, err)
			assert.ElementsMatch(t, []uint32{ia, ib}, got)
			_, err = a.Choose(Request{Size: 100, Replicas: 2, MinReplicas: 2, NoSuspect: true})
			assert.ErrorIs(t, err, errcode.ErrNoAvailableHandle)

			assert.Zero(t, a.ClearSuspect(UUID{Lo: 1}), "another client's heartbeat")
			assert.Equal(t, 1, a.ClearSuspect(UUID{Lo: 2}))
			assert.Zero(t, a.Suspects())

			a.MarkSuspect(seg(2, "b", 2, 0).ID)
			_, err = a.Unmount(seg(2, "b", 2, 0).ID, nil)
			require.NoError(t, err)
			_, _, ok = a.MarkSuspect(seg(2, "b", 2, 0).ID)
			assert.False(t, ok, "an unmounting segment")
			require.NoError(t, a.Release(ib, nil))
			assert.Zero(t, a.Suspects())
		})
	}
}
