package store

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/service"
	"github.com/crescent-kv/crescent/store/storepb"
)

// inflating is a master whose read answers claim replicas of 2^50 bytes.
type inflating struct{ storepb.MasterServer }

func inflate(reps []*storepb.ReplicaDescriptor) {
	for _, r := range reps {
		if m := r.GetMemory(); m != nil {
			m.Size = 1 << 50
		}
	}
}

func (f inflating) GetReplicaList(ctx context.Context, r *storepb.GetReplicaListRequest) (*storepb.GetReplicaListResponse, error) {
	resp, err := f.MasterServer.GetReplicaList(ctx, r)
	inflate(resp.GetReplicas())
	return resp, err
}

func (f inflating) BatchGetReplicaList(ctx context.Context, r *storepb.BatchGetReplicaListRequest) (*storepb.BatchGetReplicaListResponse, error) {
	r.Packed = false // sizes are in the messages
	resp, err := f.MasterServer.BatchGetReplicaList(ctx, r)
	for _, x := range resp.GetResults() {
		inflate(x.Replicas)
	}
	return resp, err
}

// TestReplicaSizeBounded: a master answering a replica larger than this
// host's memory gets INVALID_REPLICA for the read, not a panic (makeslice)
// or an out-of-memory abort of the process embedding the client.
func TestReplicaSizeBounded(t *testing.T) {
	m, err := master.New(master.Config{})
	require.NoError(t, err)
	require.NoError(t, m.Start())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	svc := service.New(m)
	storepb.RegisterMasterServer(g, inflating{svc})
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
	c := newTestClient(t, &testMaster{m: m, addr: lis.Addr().String()}, 16<<20, func(c *Config) { c.MasterProtocol = "grpc" })
	ctx := tctx(t)
	require.NoError(t, c.Put(ctx, "k", []byte("value"), ReplicateConfig{}))
	require.NoError(t, c.Put(ctx, "k2", []byte("value2"), ReplicateConfig{}))

	_, err = c.Get(ctx, "k")
	require.ErrorIs(t, err, errcode.ErrInvalidReplica)
	require.ErrorContains(t, err, "more than this host's memory")
	_, errs := c.BatchGet(ctx, []string{"k", "k2"})
	for _, err := range errs {
		require.ErrorIs(t, err, errcode.ErrInvalidReplica)
	}
	_, err = c.GetBuffer(ctx, "k")
	require.ErrorIs(t, err, errcode.ErrInvalidReplica)
}
