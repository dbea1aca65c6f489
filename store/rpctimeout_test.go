package store

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
)

// TestRPCTimeoutStalledMaster: against a master that stops answering
// (its durability wait stalls), a put made with no deadline of its own
// fails ErrRPCTimeout after Config.RPCTimeout, over crpc (whose
// connection bounds each call itself: no timer per call) as over gRPC
// (a context per call), and the master's handler sees the deadline and
// gives up.
func TestRPCTimeoutStalledMaster(t *testing.T) {
	for _, proto := range []string{"crpc", "grpc"} {
		t.Run(proto, func(t *testing.T) {
			m, err := master.New(master.Config{})
			require.NoError(t, err)
			require.NoError(t, m.Start())
			var stall atomic.Bool
			deadlines := make(chan time.Duration, 16)
			ended := make(chan error, 16)
			wait := func(ctx context.Context) error {
				if !stall.Load() {
					return nil
				}
				d := time.Duration(0)
				if dl, ok := ctx.Deadline(); ok {
					d = time.Until(dl)
				}
				deadlines <- d
				crpc.Detach(ctx) // as a real wait does: the connection's other calls go on
				<-ctx.Done()
				ended <- ctx.Err()
				return ctx.Err()
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			sctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() {
				served <- service.New(m, service.WithGracePeriod(100*time.Millisecond),
					service.WithDurability(wait, func() error { return nil })).Serve(sctx, lis)
			}()
			t.Cleanup(func() { // after the client's Close (cleanups run last first)
				cancel()
				assert.NoError(t, <-served)
				m.Close()
			})

			const timeout = 300 * time.Millisecond
			c := newTestClient(t, &testMaster{m: m, addr: lis.Addr().String()}, 16<<20, func(c *Config) {
				c.MasterProtocol, c.RPCTimeout = proto, timeout
			})
			assert.Equal(t, proto == "crpc", c.selfTimed(), "a crpc connection bounds its calls itself")
			require.NoError(t, c.Put(context.Background(), "before", []byte("v"), ReplicateConfig{}))

			stall.Store(true)
			done := make(chan error, 1)
			go func() { done <- c.Put(context.Background(), "stalled", []byte("v"), ReplicateConfig{}) }()
			select {
			case err := <-done:
				assert.ErrorIs(t, err, errcode.ErrRPCTimeout)
			case <-time.After(20 * time.Second): // a hang detector, not a measure
				t.Fatal("the put did not end")
			}
			stall.Store(false)
			d := <-deadlines
			assert.Greater(t, d, time.Duration(0), "the master's handler has the call's deadline")
			assert.LessOrEqual(t, d, timeout)
			assert.Error(t, <-ended, "the master's handler gives up")
		})
	}
}
