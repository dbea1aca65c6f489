package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/crescent-kv/crescent/internal/grpctune"
	"github.com/crescent-kv/crescent/internal/testsvc"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestRunGRPCTuned: --grpc_tuned serves tuned gRPC clients (their
// options, keepalive included) on the RPC port.
func TestRunGRPCTuned(t *testing.T) {
	c := defaults()
	c.RPCAddress = "127.0.0.1"
	c.RPCPort, c.MetricsPort = testsvc.FreePort(t), testsvc.FreePort(t)
	c.GRPCTuned, c.LogLevel = true, "error"
	ctx, stop := startRun(t, c)
	defer func() { require.NoError(t, stop()) }()
	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(c.RPCPort),
		append(grpctune.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	require.NoError(t, err)
	defer conn.Close()
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
	defer rcancel()
	_, err = storepb.NewMasterClient(conn).ServiceReady(rctx, &storepb.ServiceReadyRequest{}, grpc.WaitForReady(true))
	require.NoError(t, err)
}
