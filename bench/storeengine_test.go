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

// An engine-baseline worker moves its slice of its client's buffer to
// (put) or from (get) the same slice of the next client's buffer.
func TestEngineBaselineMovesBytes(t *testing.T) {
	ctx := context.Background()
	im, err := newMaster(ctx, &StoreConfig{}, OplogOff)
	require.NoError(t, err)
	defer im.close()
	c := smallStore("put", BaselineEngine)
	c.Threads = 2
	require.NoError(t, c.setDefaults())
	p := &storePlan{RunID: runID(), Ring: 1}
	cs, err := startClients(ctx, &c, im.addr, p)
	defer closeClients(cs)
	require.NoError(t, err)
	a, b := cs[0].(*localClient), cs[1].(*localClient)
	require.Len(t, a.engSteps, 2)
	vs := c.ValueSize
	slice := func(lc *localClient, w int) []byte { return lc.bufs[w*vs : (w+1)*vs] }

	var h Histogram
	copy(slice(a, 1), bytes.Repeat([]byte("put!"), vs/4))
	r, err := a.engSteps[1](ctx, &h)
	require.NoError(t, err)
	assert.Equal(t, stepResult{keys: 1, bytes: int64(vs)}, r)
	assert.Equal(t, slice(a, 1), slice(b, 1), "the put did not land in the next client's buffer")
	assert.NotEqual(t, slice(a, 1), slice(b, 0), "the put landed in another worker's slice")

	c.Operation = "get"
	copy(slice(a, 0), bytes.Repeat([]byte("get?"), vs/4))
	r, err = b.engSteps[0](ctx, &h)
	require.NoError(t, err)
	assert.True(t, r.get)
	assert.Equal(t, slice(a, 0), slice(b, 0), "the get did not read the next client's buffer")
	assert.EqualValues(t, 2, h.n)
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
