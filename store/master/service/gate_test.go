package service

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/storepb"
)

// TestGateClosesAnswers: once the gate says no, every RPC, reads too,
// answers UNAVAILABLE with its reason; while it says yes, they answer.
func TestGateClosesAnswers(t *testing.T) {
	e := mastertest.New(t, nil)
	var closed atomic.Bool
	c, _ := serve(t, e.M, WithGate(func() error {
		if closed.Load() {
			return errors.New("lease ended")
		}
		return nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.ExistKey(ctx, &storepb.ExistKeyRequest{Key: "k"})
	require.NoError(t, err)
	closed.Store(true)
	_, err = c.ExistKey(ctx, &storepb.ExistKeyRequest{Key: "k"})
	require.Error(t, err)
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Contains(t, err.Error(), "lease ended")
	_, err = c.Ping(ctx, &storepb.PingRequest{ClientId: pbID(mastertest.Client(1))})
	assert.Equal(t, codes.Unavailable, status.Code(err))
}

// TestDurableWaitCounted: with a log, every answer's wait for durability
// is counted per RPC with its time; a master without one counts none.
func TestDurableWaitCounted(t *testing.T) {
	e := mastertest.New(t, nil)
	const hold = 20 * time.Millisecond
	var waits atomic.Int64
	c, svc := serve(t, e.M, WithDurability(func(ctx context.Context) error {
		waits.Add(1)
		time.Sleep(hold)
		return nil
	}, func() error { return nil }))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 3 {
		_, err := c.ServiceReady(ctx, &storepb.ServiceReadyRequest{})
		require.NoError(t, err)
	}
	_, err := c.ExistKey(ctx, &storepb.ExistKeyRequest{Key: "k"})
	require.NoError(t, err)
	require.EqualValues(t, 4, waits.Load())
	counts := map[string]RPCCount{}
	for _, rc := range svc.Counts() {
		counts[rc.Name] = rc
	}
	assert.EqualValues(t, 3, counts["service_ready"].DurableWaits)
	assert.GreaterOrEqual(t, counts["service_ready"].DurableWaitNanos, uint64(3*hold))
	assert.EqualValues(t, 1, counts["exist_key"].DurableWaits)
	assert.GreaterOrEqual(t, counts["exist_key"].DurableWaitNanos, uint64(hold))
	assert.Zero(t, counts["ping"].DurableWaits)

	pc, plain := serve(t, e.M)
	_, err = pc.ServiceReady(ctx, &storepb.ServiceReadyRequest{})
	require.NoError(t, err)
	for _, rc := range plain.Counts() {
		assert.Zero(t, rc.DurableWaits, rc.Name)
		assert.Zero(t, rc.DurableWaitNanos, rc.Name)
	}
}
