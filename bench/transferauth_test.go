package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRunTransferAuth(t *testing.T) {
	for _, proto := range []string{"tcp", "shm"} {
		t.Run(proto, func(t *testing.T) {
			res, err := RunTransferAuth(context.Background(), TransferConfig{
				Protocol: proto, Operation: "write", BlockSize: 64 << 10, BatchSize: 4, Threads: 1,
				Duration: 100 * time.Millisecond, Warmup: -1,
			}, 2)
			require.NoError(t, err)
			require.Equal(t, 2, res.Rounds)
			for _, r := range []TransferResult{res.Off, res.On} {
				require.Positive(t, r.Batches)
				require.Equal(t, r.Batches*4*64<<10, r.Bytes, "bytes add up over the rounds")
				require.Positive(t, r.BaselineGBps)
			}
			require.InDelta(t, res.On.ThroughputGBps/res.Off.ThroughputGBps, res.Ratio, 1e-9)
		})
	}
	_, err := RunTransferAuth(context.Background(), TransferConfig{Mode: "initiator", SegmentID: "x:1"}, 1)
	require.Error(t, err)
}
