package store

import (
	"context"
	"net"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
	"github.com/crescent-kv/crescent/store/storepb"
)

// inflating is a master whose read answers claim replicas of size bytes.
type inflating struct {
	storepb.MasterServer
	size uint64
}

func inflate(reps []*storepb.ReplicaDescriptor, size uint64) {
	for _, r := range reps {
		if m := r.GetMemory(); m != nil {
			m.Size = size
		}
	}
}

func (f inflating) GetReplicaList(ctx context.Context, r *storepb.GetReplicaListRequest) (*storepb.GetReplicaListResponse, error) {
	resp, err := f.MasterServer.GetReplicaList(ctx, r)
	inflate(resp.GetReplicas(), f.size)
	return resp, err
}

func (f inflating) BatchGetReplicaList(ctx context.Context, r *storepb.BatchGetReplicaListRequest) (*storepb.BatchGetReplicaListResponse, error) {
	r.Packed = false // sizes are in the messages
	resp, err := f.MasterServer.BatchGetReplicaList(ctx, r)
	for _, x := range resp.GetResults() {
		inflate(x.Replicas, f.size)
	}
	return resp, err
}

// TestReplicaSizeBounded: a master answering a replica larger than this
// host's memory gets INVALID_REPLICA for the read, not a panic (makeslice)
// or an out-of-memory abort of the process embedding the client.
func TestReplicaSizeBounded(t *testing.T) {
	c := newInflatingClient(t, 1<<50)
	ctx := tctx(t)
	require.NoError(t, c.Put(ctx, "k", []byte("value"), ReplicateConfig{}))
	require.NoError(t, c.Put(ctx, "k2", []byte("value2"), ReplicateConfig{}))

	_, err := c.Get(ctx, "k")
	require.ErrorIs(t, err, errcode.ErrInvalidReplica)
	require.ErrorContains(t, err, "more than this host's memory")
	_, errs := c.BatchGet(ctx, []string{"k", "k2"})
	for _, err := range errs {
		require.ErrorIs(t, err, errcode.ErrInvalidReplica)
	}
	_, err = c.GetBuffer(ctx, "k")
	require.ErrorIs(t, err, errcode.ErrInvalidReplica)
}

// TestReplicaSizeCheckedBeforeAllocating: a master answering a replica
// of 1 GiB (less than this host's memory, more than the segment
// registered) gets INVALID_REPLICA for Get, BatchGet and GetBuffer, and
// the client allocates no buffer that size first.
func TestReplicaSizeCheckedBeforeAllocating(t *testing.T) {
	if hostMemory() < 4<<30 {
		t.Skip("the host has less than 4 GiB")
	}
	c := newInflatingClient(t, 1<<30)
	ctx := tctx(t)
	require.NoError(t, c.Put(ctx, "k", []byte("value"), ReplicateConfig{}))
	require.NoError(t, c.Put(ctx, "k2", []byte("value2"), ReplicateConfig{}))

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := c.Get(ctx, "k")
	require.ErrorIs(t, err, errcode.ErrInvalidReplica)
	require.ErrorContains(t, err, "not in a registered buffer")
	_, errs := c.BatchGet(ctx, []string{"k", "k2"})
	for _, err := range errs {
		require.ErrorIs(t, err, errcode.ErrInvalidReplica)
	}
	_, err = c.GetBuffer(ctx, "k")
	require.ErrorIs(t, err, errcode.ErrInvalidReplica)
	runtime.ReadMemStats(&after)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<20), "bytes allocated by the reads")
}

// newInflatingClient is a client of a master served through inflating.
func newInflatingClient(t *testing.T, size uint64) *Client {
	m, err := master.New(master.Config{})
	require.NoError(t, err)
	require.NoError(t, m.Start())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	svc := service.New(m)
	storepb.RegisterMasterServer(g, inflating{svc, size})
	served := make(chan struct{})
	go func() {
		defer close(served)
		g.Serve(lis)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-served
		m.Close()
	})
	return newTestClient(t, &testMaster{m: m, addr: lis.Addr().String()}, 16<<20, func(c *Config) { c.MasterProtocol = "grpc" })
}
