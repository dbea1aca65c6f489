package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStoreDummyHot: "store --dummy 2 --hot --json" prints the hot
// phase with its memcpy baseline and ratio.
func TestStoreDummyHot(t *testing.T) {
	var out bytes.Buffer
	err := storeMain(context.Background(), []string{"--dummy", "2", "--hot", "--value_size", "64KiB", "--duration", "0.2", "--json"}, &out)
	require.NoError(t, err)
	var res map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &res))
	require.Equal(t, "memcpy", res["baseline"])
	require.Positive(t, res["baseline_gbps"])
	require.Positive(t, res["ratio"])
	require.NotContains(t, res, "remote_replica")
}
