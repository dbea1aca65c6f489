package bench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunStoreTLS: --tls runs the workload over mTLS and, by default,
// the same workload without TLS as the baseline, crpc and gRPC alike.
func TestRunStoreTLS(t *testing.T) {
	for _, proto := range []string{"crpc", "grpc"} {
		t.Run(proto, func(t *testing.T) {
			c := smallStore("put", "")
			c.TLS, c.MasterProtocol = true, proto
			res, err := RunStore(context.Background(), c)
			require.NoError(t, err)
			assert.Equal(t, BaselineTLSOff, res.Baseline)
			assert.Equal(t, proto, res.MasterProtocol)
			assert.Positive(t, res.OpsPerSec)
			assert.Positive(t, res.BaselineOpsPerSec)
			assert.InDelta(t, res.ThroughputGBps/res.BaselineGBps, res.Ratio, 1e-9)
		})
	}
	for name, edit := range map[string]func(*StoreConfig){
		"tls_off without --tls": func(c *StoreConfig) { c.Baseline = BaselineTLSOff },
		"an external master":    func(c *StoreConfig) { c.TLS, c.MasterAddr = true, "127.0.0.1:1" },
		"drpc":                  func(c *StoreConfig) { c.TLS, c.MasterProtocol = true, LayerDRPC },
	} {
		c := smallStore("put", "none")
		edit(&c)
		_, err := RunStore(context.Background(), c)
		assert.ErrorIs(t, err, ErrStoreConfig, name)
	}
}
