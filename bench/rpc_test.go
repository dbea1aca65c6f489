package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/storepb"
)

// TestRunRPC: a short run answers on every layer, every cell has its
// fields, and the ratios are against plain gRPC.
func TestRunRPC(t *testing.T) {
	rows, err := RunRPC(context.Background(), RPCConfig{Duration: 200 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, rows, len(RPCLayers)*2)
	for i, r := range rows {
		require.Equal(t, RPCLayers[i%len(RPCLayers)], r.Layer)
		require.Equal(t, []int{1, 8}[i/len(RPCLayers)], r.Inflight)
		require.Positive(t, r.Calls, r.Layer)
		require.Positive(t, r.CallsPerSec, r.Layer)
		require.Positive(t, r.P50Us, r.Layer)
		require.GreaterOrEqual(t, r.P99Us, r.P50Us, r.Layer)
		require.Positive(t, r.Ratio, r.Layer)
		require.Zero(t, r.Errors, r.Layer)
		require.Positive(t, r.CPUUsPerCall, r.Layer)
		if r.Layer == LayerGRPC {
			require.Equal(t, 1.0, r.Ratio)
		}
	}
	// Without the baseline there is no ratio.
	rows, err = RunRPC(context.Background(), RPCConfig{Layers: []string{LayerDRPC}, Inflight: []int{2}, Duration: 50 * time.Millisecond, Rounds: 1})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Zero(t, rows[0].Ratio)
}

// TestRunRPCShortSlice: a slice shorter than a worker's start still gets
// a call from each worker (it failed "no call answered" on a loaded
// machine).
func TestRunRPCShortSlice(t *testing.T) {
	rows, err := RunRPC(context.Background(), RPCConfig{Layers: []string{LayerGRPC, LayerDRPC}, Inflight: []int{2}, Duration: time.Nanosecond, Rounds: 1})
	require.NoError(t, err)
	for _, r := range rows {
		require.GreaterOrEqual(t, r.Calls, int64(2), r.Layer)
	}
}

func TestRPCConfigErrors(t *testing.T) {
	for _, c := range []RPCConfig{
		{Layers: []string{"http"}},
		{Layers: []string{LayerCRPC, LayerCRPC}},
		{Inflight: []int{0}},
		{Duration: -time.Second},
		{Rounds: -1},
	} {
		_, err := RunRPC(context.Background(), c)
		require.ErrorIs(t, err, ErrRPCConfig, "%+v", c)
	}
}

// TestRunStoreLayers: the store bench on each master protocol, in
// process and (drpc, grpc_tuned) with client processes.
func TestRunStoreLayers(t *testing.T) {
	for _, p := range []string{LayerGRPC, LayerGRPCTuned, LayerCRPC, LayerDRPC} {
		for _, procs := range []bool{false, true} {
			if procs && p != LayerDRPC && p != LayerGRPCTuned {
				continue
			}
			name := p
			if procs {
				name += "/processes"
			}
			t.Run(name, func(t *testing.T) {
				c := smallStore("mixed", "none")
				c.Duration, c.MasterProtocol = 200*time.Millisecond, p
				if procs {
					c.ClientProcesses = true
					c.ClientCommand = []string{os.Args[0], "-test.run=^$"}
					c.ClientEnv = []string{storeChildEnv + "=1"}
				}
				res, err := RunStore(context.Background(), c)
				require.NoError(t, err)
				c.Batch = 1
				checkResult(t, c, res)
				require.Equal(t, p, res.MasterProtocol)
			})
		}
	}
	// meta dials the master itself.
	c := smallStore("meta", "none")
	c.MasterProtocol, c.Objects, c.Batch = LayerDRPC, 1000, 100
	res, err := RunStore(context.Background(), c)
	require.NoError(t, err)
	require.EqualValues(t, 1000, res.Puts)
	require.Equal(t, LayerDRPC, res.MasterProtocol)
}

func TestStoreConfigProtocolErrors(t *testing.T) {
	c := smallStore("get", "none")
	c.MasterProtocol = "http"
	_, err := RunStore(context.Background(), c)
	require.ErrorIs(t, err, ErrStoreConfig)
	c.MasterProtocol, c.MasterAddr = LayerDRPC, "127.0.0.1:1"
	_, err = RunStore(context.Background(), c)
	require.ErrorIs(t, err, ErrStoreConfig)
	require.ErrorContains(t, err, "in-process master")
}

// BenchmarkRPC: one ExistKey round trip per op on each layer (go test
// -bench RPC ./bench).
func BenchmarkRPC(b *testing.B) {
	for _, l := range RPCLayers {
		b.Run(l, func(b *testing.B) {
			ctx := context.Background()
			mc, stop := rpcClient(b, l)
			defer stop()
			req := &storepb.ExistKeyRequest{Key: "missing", NoLease: true}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := mc.ExistKey(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// rpcClient is a master client over layer l of a new rig.
func rpcClient(tb testing.TB, l string) (storepb.MasterClient, func()) {
	tb.Helper()
	r, err := newRPCRig(context.Background(), []string{l})
	require.NoError(tb, err)
	return storepb.NewMasterClient(r.conns[l]), func() { require.NoError(tb, r.close()) }
}
