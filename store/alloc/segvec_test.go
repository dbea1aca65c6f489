package alloc

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSegVecCopyOnWrite: a version changed by set or push leaves every
// entry an older version sees as it was, across chunk boundaries.
func TestSegVecCopyOnWrite(t *testing.T) {
	states := make([]*segState, 3*segChunk+10)
	for i := range states {
		states[i] = &segState{idx: uint32(i)}
	}
	var v segVec
	var versions []segVec
	for i, s := range states {
		v.push(s)
		if i%97 == 0 {
			versions = append(versions, v)
		}
	}
	old := v
	v.set(5, nil)
	v.set(segChunk, states[0])
	v.push(states[1])
	require.Equal(t, len(states)+1, v.len())
	assert.Nil(t, v.get(5))
	assert.Same(t, states[0], v.get(segChunk))
	assert.Same(t, states[1], v.at(uint32(len(states))))
	assert.Nil(t, v.get(uint32(len(states)+1)), "past the end")

	require.Equal(t, len(states), old.len())
	for i := range states {
		require.Same(t, states[i], old.get(uint32(i)), "entry %d of the older version", i)
	}
	assert.Nil(t, old.get(uint32(len(states))))
	for _, ver := range versions {
		for i := range ver.len() {
			require.Same(t, states[i], ver.at(uint32(i)))
		}
	}

	n := newSegVec(2*segChunk + 1)
	require.Equal(t, 2*segChunk+1, n.len())
	for i := range n.len() {
		require.Nil(t, n.at(uint32(i)))
	}
	n.push(states[2])
	assert.Same(t, states[2], n.get(uint32(2*segChunk+1)))
}

// TestLargestSegmentAfterRelease: the largest capacity stays while any
// segment of it is mounted, and falls to the next once the last goes.
func TestLargestSegmentAfterRelease(t *testing.T) {
	a := New(Random)
	for i := range 3 {
		mustMount(t, a, seg(i+1, fmt.Sprint("big", i), 1, 4<<20))
	}
	mustMount(t, a, seg(10, "small", 1, 2<<20))
	release := func(n int) { // segment seg(n, ...)
		i, err := a.Unmount(UUID{Hi: 1, Lo: uint64(n)}, nil)
		require.NoError(t, err)
		require.NoError(t, a.Release(i, nil))
	}
	require.EqualValues(t, 4<<20, a.LargestSegment())
	release(1)
	release(2)
	assert.EqualValues(t, 4<<20, a.LargestSegment(), "one 4 MiB segment is left")
	release(3)
	assert.EqualValues(t, 2<<20, a.LargestSegment())
	mustMount(t, a, seg(20, "big-again", 1, 4<<20)) // at a reused index
	assert.EqualValues(t, 4<<20, a.LargestSegment())
	release(20)
	assert.EqualValues(t, 2<<20, a.LargestSegment())
}
