package bench

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The engine baseline runs in the same run, alternating with the store,
// and the result names it with its throughput and the ratio.
func TestRunStoreEngineBaseline(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*StoreConfig)
		batch int
	}{
		{"put", func(c *StoreConfig) { c.Operation = "put" }, 1},
		{"get", func(c *StoreConfig) { c.Operation = "get" }, 1},
		{"batch-mixed", func(c *StoreConfig) { c.Operation, c.Batch = "mixed", 4 }, 4},
		{"processes", func(c *StoreConfig) {
			c.Operation, c.ClientProcesses = "mixed", true
			c.ClientCommand = []string{os.Args[0], "-test.run=^$"}
			c.ClientEnv = []string{storeChildEnv + "=1"}
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := smallStore("", BaselineEngine)
			tc.edit(&c)
			res, err := RunStore(context.Background(), c)
			require.NoError(t, err)
			c.Batch = tc.batch
			checkResult(t, c, res)
			assert.Equal(t, BaselineEngine, res.Baseline)
			require.Positive(t, res.BaselineGBps)
			require.Positive(t, res.BaselineOpsPerSec)
			assert.InDelta(t, res.ThroughputGBps/res.BaselineGBps, res.Ratio, 1e-9)
			assert.Positive(t, res.BaselineP50us)
		})
	}
}

// An engine-baseline worker moves its value slice to (put) or from (get)
// the next client's region, a value further on each call, so a run
// touches the region as a whole (as the store's run touches its keys).
func TestEngineBaselineMovesBytes(t *testing.T) {
	ctx := context.Background()
	im, err := newMaster(ctx, &StoreConfig{}, OplogOff)
	require.NoError(t, err)
	defer im.close()
	c := smallStore("put", BaselineEngine)
	c.Threads = 2
	require.NoError(t, c.setDefaults())
	gets, ring, err := c.plan()
	require.NoError(t, err)
	p := &storePlan{RunID: runID(), GetKeys: gets, Ring: ring}
	cs, err := startClients(ctx, &c, im.addr, p)
	defer closeClients(cs)
	require.NoError(t, err)
	a, b := cs[0].(*localClient), cs[1].(*localClient)
	require.Len(t, a.engSteps, 2)
	vs := c.ValueSize
	slots, err := c.engineSlots()
	require.NoError(t, err)
	require.Equal(t, c.Threads*ring, slots, "the region holds what the put rings hold")
	require.Len(t, b.engRegion, slots*vs)
	slice := func(lc *localClient, w int) []byte { return lc.bufs[w*vs : (w+1)*vs] }
	slot := func(lc *localClient, i int) []byte { return lc.engRegion[i*vs : (i+1)*vs] }

	var h Histogram
	first := slots / 2 // worker 1 of 2 starts half-way
	for k, fill := range []string{"put!", "two!"} {
		copy(slice(a, 1), bytes.Repeat([]byte(fill), vs/4))
		r, err := a.engSteps[1](ctx, &h)
		require.NoError(t, err)
		assert.Equal(t, stepResult{keys: 1, bytes: int64(vs)}, r)
		assert.Equal(t, slice(a, 1), slot(b, first+k), "put %d did not land in the next slot of the next client's region", k)
	}
	assert.NotEqual(t, slot(b, first), slot(b, first+1))

	c.Operation = "get"
	copy(slot(a, 0), bytes.Repeat([]byte("get?"), vs/4))
	r, err := b.engSteps[0](ctx, &h)
	require.NoError(t, err)
	assert.True(t, r.get)
	assert.Equal(t, slot(a, 0), slice(b, 0), "the get did not read the next client's region")
	assert.EqualValues(t, 3, h.n)
}

func TestStoreConfigEngineBaselineErrors(t *testing.T) {
	for name, edit := range map[string]func(*StoreConfig){
		"meta":   func(c *StoreConfig) { c.Operation = "meta" },
		"staged": func(c *StoreConfig) { c.Staged = true },
	} {
		c := smallStore("get", BaselineEngine)
		edit(&c)
		_, err := RunStore(context.Background(), c)
		require.ErrorIs(t, err, ErrStoreConfig, name)
		assert.Contains(t, err.Error(), "engine", name)
	}
}

// A put run leaves room in the segments for the clients' put-ahead
// reservations: the default budget fits above the ring's share, a larger
// one shrinks the ring, one that leaves no room leaves it half its
// share, and with put-ahead off the budget is not counted.
func TestPlanLeavesRoomForPutAhead(t *testing.T) {
	ring := func(mod func(*StoreConfig)) (int, error) {
		c := StoreConfig{Operation: "put", SegmentSize: 1 << 30, ValueSize: 1 << 20, Threads: 4, Batch: 8}
		mod(&c)
		require.NoError(t, c.setDefaults())
		_, r, err := c.plan()
		return r, err
	}
	def, err := ring(func(*StoreConfig) {})
	require.NoError(t, err)
	perValue := float64(reserved(1 << 20))
	assert.Equal(t, int(putShare*(1<<30)/perValue)/4/8*8, def, "the default budget leaves the ring its share")
	big, err := ring(func(c *StoreConfig) { c.PutAheadBytes = 256 << 20 })
	require.NoError(t, err)
	assert.Less(t, big, def)
	used := float64(4*big)*perValue + float64(reserved(256<<20))
	assert.LessOrEqual(t, used, aheadShare*(1<<30), "ring and reservations fit the share")
	off, err := ring(func(c *StoreConfig) { c.PutAheadBytes, c.PutAhead = 256<<20, -1 })
	require.NoError(t, err)
	assert.Equal(t, def, off)
	half, err := ring(func(c *StoreConfig) { c.PutAheadBytes = 900 << 20 })
	require.NoError(t, err)
	assert.Equal(t, int(putShare/2*(1<<30)/perValue)/4/8*8, half)
}
