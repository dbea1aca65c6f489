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
