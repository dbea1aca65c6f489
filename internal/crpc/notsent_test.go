package crpc

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNotSent: a call that found no server was never sent (NotSent, still
// UNAVAILABLE); one the server received and lost with the connection may
// have run, and is not marked.
func TestNotSent(t *testing.T) {
	lis := listen(t)
	addr := lis.Addr().String()
	_, svc, stop := serveOn(t, lis)
	c := dial(t, addr)
	ctx := tctx(t)

	// In the handler when the server goes: sent, maybe applied.
	errc := make(chan error, 1)
	go func() { _, err := call(ctx, c, "Block", "x"); errc <- err }()
	<-svc.entered
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	err := <-errc
	require.Error(t, err)
	assert.False(t, NotSent(err), "a call the server received is marked not sent: %v", err)
	// The listener is closed only once stop returns; a dial before that
	// can still be accepted, and then closed (ErrNotCRPC, not a dial error).
	<-stopped

	// Nobody listens now: the dial fails before anything is written.
	_, err = call(ctx, c, "Echo", "y")
	require.Error(t, err)
	assert.True(t, NotSent(err), "%v", err)
	assert.Equal(t, codes.Unavailable, status.Code(err))

	// A closed Conn sends nothing either.
	require.NoError(t, c.Close())
	_, err = call(ctx, c, "Echo", "z")
	require.Error(t, err)
	assert.True(t, NotSent(err), "%v", err)
	assert.False(t, NotSent(nil))

	// Nor does a Dial that finds nobody.
	_, err = Dial(ctx, addr)
	require.Error(t, err)
	assert.True(t, NotSent(err), "%v", err)
	assert.Equal(t, codes.Unavailable, status.Code(err))
}
