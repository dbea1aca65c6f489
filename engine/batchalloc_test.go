package engine_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAllocateBatchAllocs: a batch costs the same number of allocations
// whatever its capacity (each task's completion callback once allocated
// a method value of its own).
func TestAllocateBatchAllocs(t *testing.T) {
	e, _ := newEngine(t, 4096)
	allocs := func(capacity int) float64 {
		return testing.AllocsPerRun(200, func() {
			id, err := e.AllocateBatch(capacity)
			require.NoError(t, err)
			require.NoError(t, e.FreeBatch(id))
		})
	}
	one, many := allocs(1), allocs(64)
	assert.Equal(t, one, many, "allocations of a batch of 1 and of 64")
}
