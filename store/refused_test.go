package store

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
	"github.com/crescent-kv/crescent/store/storepb"
)

// boundedMaster serves a master with crpc bounds cfg (gRPC follows them
// too) until the test ends, and returns its service and a gRPC master
// connection's client, dialled as clients dial.
func boundedMaster(t *testing.T, cfg crpc.ServerConfig) (*service.Service, storepb.MasterClient) {
	tm := startMaster(t, master.Config{}, service.WithCRPC(cfg, netx.Config{}))
	conn, proto, err := DialMaster(tctx(t), tm.addr, "grpc", nil)
	require.NoError(t, err)
	require.Equal(t, "grpc", proto)
	t.Cleanup(func() { conn.Close() })
	return tm.svc, storepb.NewMasterClient(conn)
}

// existBursts makes rounds of n concurrent BatchExistKey calls of about
// 1 MiB (512 keys of 2 KiB) with mc, each answered in full, until
// retried() says some call was refused and retried (then it logs how
// many), failing the test if none was after 20 rounds.
func existBursts(t *testing.T, mc storepb.MasterClient, n int, retried func() int64) {
	keys := make([]string, 512)
	for i := range keys {
		keys[i] = fmt.Sprintf("%04d", i) + strings.Repeat("k", 2044)
	}
	for round := 0; round < 20; round++ {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range errs {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				resp, err := mc.BatchExistKey(ctx, &storepb.BatchExistKeyRequest{Keys: keys})
				if err == nil && len(resp.GetResults()) != len(keys) {
					err = fmt.Errorf("%d answers for %d keys", len(resp.GetResults()), len(keys))
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "round %d call %d", round, i)
		}
		if r := retried(); r > 0 {
			t.Logf("%d refused calls retried by round %d", r, round)
			return
		}
	}
	t.Fatal("the master refused no call: the test did not exercise a retry")
}

// TestGRPCRefusedCallsRetried: a master whose gRPC request bytes are
// bounded refuses calls it cannot admit with REFUSED_STREAM (nothing
// processed). A gRPC master connection retries them, whatever the
// method and size: grpc-go's own transparent retry covers only a first
// refusal of a call under 256 KiB.
func TestGRPCRefusedCallsRetried(t *testing.T) {
	svc, mc := boundedMaster(t, crpc.ServerConfig{MaxFrame: 2 << 20, MaxBufferedBytes: 4 << 20, FrameTimeout: 3 * time.Second})
	existBursts(t, mc, 16, func() int64 { _, refused := svc.GRPCRequestBytes(); return refused })
}

// TestRefusedRetryBounded: a call refused again and again is tried
// 1 + maxRefusedRetries times, or until its context ends, and ends with
// the refusal; other errors are not retried.
func TestRefusedRetryBounded(t *testing.T) {
	refused := status.Error(codes.Unavailable, "stream terminated by RST_STREAM with error code: REFUSED_STREAM")
	calls := 0
	invoke := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		calls++
		return refused
	}
	err := retryRefused(context.Background(), "/m", nil, nil, nil, invoke)
	assert.Equal(t, refused, err)
	assert.Equal(t, 1+maxRefusedRetries, calls)

	calls = 0
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = retryRefused(ctx, "/m", nil, nil, nil, invoke)
	assert.Equal(t, refused, err)
	assert.Greater(t, calls, 1, "retried")
	assert.Less(t, calls, 1+maxRefusedRetries, "stopped with the context")

	calls = 0
	other := status.Error(codes.Unavailable, "connection reset by peer")
	err = retryRefused(context.Background(), "/m", nil, nil, nil, func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		calls++
		return other
	})
	assert.Equal(t, other, err)
	assert.Equal(t, 1, calls)
}

// TestGRPCCallsBoundRetried: calls past the master's bound on gRPC calls
// open are answered RESOURCE_EXHAUSTED before they are read; a gRPC
// master connection sends them again.
func TestGRPCCallsBoundRetried(t *testing.T) {
	svc, mc := boundedMaster(t, crpc.ServerConfig{MaxCalls: 2})
	existBursts(t, mc, 8, svc.GRPCCallsRefused)
}
