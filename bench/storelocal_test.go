package bench

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRunStoreLocal: every phase of the dummy benchmark runs and
// reports, the hot phase against memcpy in the same run.
func TestRunStoreLocal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := RunStoreLocal(ctx, LocalConfig{Dummies: 2, ValueSize: 64 << 10, Duration: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Equal(t, "memcpy", res.Baseline)
	require.Positive(t, res.BaselineGBps)
	require.Positive(t, res.Ratio)
	require.Positive(t, res.Hot.Ops)
	require.Positive(t, res.HotHits)
	for _, p := range []*LocalPhase{res.LocalReplica, res.Remote, res.Put} {
		require.NotNil(t, p)
		require.Positive(t, p.Ops)
	}
	require.Positive(t, res.IPCp50us)
	b, err := json.Marshal(res)
	require.NoError(t, err)
	for _, k := range []string{`"baseline":"memcpy"`, `"baseline_gbps"`, `"ratio"`, `"ipc_p99_us"`, `"remote_replica"`} {
		require.Contains(t, string(b), k)
	}
	_, err = RunStoreLocal(ctx, LocalConfig{Dummies: 65})
	require.ErrorIs(t, err, ErrStoreConfig)
}
