package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRPCMain: --json prints a row per layer and in-flight count with
// every field; the text table has a line each; bad flags are refused.
func TestRPCMain(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, rpcMain(context.Background(), []string{"--duration", "0.2", "--json"}, &out))
	var rows []map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &rows), out.String())
	require.Len(t, rows, 8)
	seen := map[string]bool{}
	for _, r := range rows {
		for _, k := range []string{"layer", "inflight", "calls", "calls_per_sec", "p50_us", "p99_us", "ratio", "errors", "cpu_us_per_call"} {
			require.Contains(t, r, k)
		}
		require.Positive(t, r["calls_per_sec"].(float64), r["layer"])
		seen[r["layer"].(string)] = true
	}
	require.Equal(t, map[string]bool{"grpc": true, "grpc_tuned": true, "crpc": true, "drpc": true}, seen)

	out.Reset()
	require.NoError(t, rpcMain(context.Background(), []string{"--duration", "0.1", "--layers", "grpc,crpc", "--inflight", "2"}, &out))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3, out.String())
	require.Contains(t, lines[2], "crpc")

	for _, args := range [][]string{{"--layers", "http"}, {"--inflight", "x"}, {"--duration", "0"}, {"extra"}} {
		require.Error(t, rpcMain(context.Background(), args, &out), args)
	}
}
