package master

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/alloc"
)

// TestForcedRemoveHoldsLeasedSpace: a forced remove of a leased object
// (Remove, RemoveAll) quarantines its space until the lease ends, so a
// reader within its lease never reads another object's bytes there; an
// unleased object's space is free at once. The hold is in the log: a
// standby replaying it holds the same space, and frees it with the
// leader's DiscardFree.
func TestForcedRemoveHoldsLeasedSpace(t *testing.T) {
	const ttl = 5 * time.Second
	e := newEnv(t, func(c *Config) { c.LeaseTTL = ttl; c.ClientTTL = 24 * time.Hour })
	a := cl(1)
	// Room for exactly two objects: a third can only reuse freed space.
	e.mount(a, "a", 2*alloc.Reserved(1000))
	old := e.put(a, "leased", 1000, ReplicateConfig{})
	e.put(a, "plain", 1000, ReplicateConfig{})
	_, _, err := e.m.GetReplicaList("leased")
	require.NoError(t, err)
	e.clk.Advance(time.Second)

	require.NoError(t, e.m.Remove("leased", true))
	st := e.m.Stats()
	assert.EqualValues(t, 1, st.Quarantined)
	assert.EqualValues(t, 2*alloc.Reserved(1000), st.Allocated, "the leased object's space is held")
	// The next put evicts "plain" (unleased) rather than reuse the hold.
	next := e.put(a, "next", 1000, ReplicateConfig{})
	assert.NotEqual(t, old[0].Addr, next[0].Addr, "placed in the space a lease still covers")
	assert.EqualValues(t, 1, e.m.Stats().Quarantined)
	checkInvariants(t, e.m)

	// An unleased object's space is reused at once.
	require.NoError(t, e.m.Remove("next", true))
	assert.EqualValues(t, 1, e.m.Stats().Quarantined)
	reps := e.put(a, "next", 1000, ReplicateConfig{})
	assert.Equal(t, next[0].Addr, reps[0].Addr)

	// Replayed, the hold is the same.
	standby, err := New(Config{Shards: 3, Clock: e.clk, Seed: 99, LeaseTTL: ttl})
	require.NoError(t, err)
	defer standby.Close()
	replay := func(from int) int {
		ops := e.log.all()
		for _, op := range ops[from:] {
			require.NoError(t, standby.Replay(op), op.Key)
		}
		return len(ops)
	}
	n := replay(0)
	require.Empty(t, diffState(dumpState(e.m), dumpState(standby)))
	assert.EqualValues(t, 1, standby.Stats().Quarantined)

	// Freed when the lease ends, not before.
	e.clk.Advance(ttl - time.Second - time.Nanosecond)
	e.m.Tick()
	assert.EqualValues(t, 1, e.m.Stats().Quarantined, "freed before the lease ended")
	e.clk.Advance(time.Nanosecond)
	e.m.Tick()
	assert.EqualValues(t, 0, e.m.Stats().Quarantined)
	reps = e.put(a, "after", 1000, ReplicateConfig{})
	assert.Equal(t, old[0].Addr, reps[0].Addr, "the only free space left")
	replay(n)
	require.Empty(t, diffState(dumpState(e.m), dumpState(standby)))
	checkInvariants(t, e.m)

	// RemoveAll(force) holds a leased object too.
	_, _, err = e.m.GetReplicaList("after")
	require.NoError(t, err)
	removed, err := e.m.RemoveAll(true)
	require.NoError(t, err)
	assert.Positive(t, removed) // "next" may have gone to a watermark eviction in Tick
	assert.False(t, e.exists("after"))
	assert.EqualValues(t, 1, e.m.Stats().Quarantined)
	checkInvariants(t, e.m)
}
