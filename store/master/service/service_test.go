package service

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/master/internal/mastertest"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// serve runs the service on a real gRPC server on 127.0.0.1:0 and returns
// a client connected to it; cleanup stops both.
func serve(t testing.TB, m *master.Master, opts ...Option) (storepb.MasterClient, *Service) {
	t.Helper()
	addr, svc := serveAddr(t, m, opts...)
	return dialSigned(t, addr), svc
}

// dialSigned is a gRPC client of the master at addr whose calls carry
// the test client's session; it is closed when the test ends, before
// the server stops.
func dialSigned(t testing.TB, addr string) storepb.MasterClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(mastertest.Sign))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return storepb.NewMasterClient(conn)
}

// serveAddr runs the service on 127.0.0.1:0 until the test ends and
// returns its address.
func serveAddr(t testing.TB, m *master.Master, opts ...Option) (string, *Service) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	svc := New(m, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String(), svc
}

func pbID(u master.UUID) *storepb.UUID { return &storepb.UUID{High: u.Hi, Low: u.Lo} }

func TestServiceRoundTrip(t *testing.T) {
	e := mastertest.New(t, nil)
	var mu sync.Mutex
	observed := map[string]int{}
	c, svc := serve(t, e.M, WithObserver(func(rpc string, d time.Duration, err error) {
		mu.Lock()
		observed[rpc]++
		mu.Unlock()
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := mastertest.Client(1), mastertest.Client(2)
	seg := &storepb.Segment{Id: pbID(master.UUID{Lo: 42}), Name: "host:1", Base: 1 << 30, Size: 1 << 20, Protocol: "tcp"}

	// A client the master does not know is told to remount.
	ping, err := c.Ping(ctx, &storepb.PingRequest{ClientId: pbID(a)})
	if err != nil || ping.ClientStatus != storepb.ClientStatus_CLIENT_STATUS_NEED_REMOUNT || ping.ViewVersion != e.M.ViewVersion() {
		t.Fatalf("Ping = %v, %v", ping, err)
	}
	if _, err := c.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: pbID(a), Segment: seg}); err != nil {
		t.Fatal(err)
	}
	if ping, _ := c.Ping(ctx, &storepb.PingRequest{ClientId: pbID(a)}); ping.ClientStatus != storepb.ClientStatus_CLIENT_STATUS_OK {
		t.Fatalf("Ping after mount = %v", ping)
	}
	st, err := c.QuerySegmentStatus(ctx, &storepb.QuerySegmentStatusRequest{SegmentId: seg.Id})
	if err != nil || st.Status != storepb.SegmentStatus_SEGMENT_STATUS_OK || st.Capacity != 1<<20 || st.Name != "host:1" {
		t.Fatalf("QuerySegmentStatus = %v, %v", st, err)
	}

	ps, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: pbID(a), Key: "k", Size: 1000,
		Config: &storepb.ReplicateConfig{ReplicaNum: 1, WithSoftPin: true, SoftPinTtlMs: 60000}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps.Replicas) != 1 || ps.Replicas[0].Status != storepb.ReplicaStatus_REPLICA_STATUS_PROCESSING ||
		ps.Replicas[0].Memory.SegmentName != "host:1" || ps.Replicas[0].Memory.Size != 1000 ||
		ps.Replicas[0].Memory.BufferAddress < 1<<30 || ps.Replicas[0].Memory.SegmentId.Low != 42 {
		t.Fatalf("PutStart = %v", ps)
	}
	if info, _ := e.M.QueryKey("k"); !info.SoftPin {
		t.Fatal("soft pin lost on the wire")
	}
	parent, lora := uint64(4), int64(-3)
	if _, err := c.PutEnd(ctx, &storepb.PutEndRequest{ClientId: pbID(a), Key: "k",
		Block: &storepb.BlockMetadata{BlockHashes: []uint64{5}, ParentBlockHash: &parent, TokenIds: []uint32{9},
			BlockSize: 16, LoraId: &lora, LoraName: "l"}}); err != nil {
		t.Fatal(err)
	}
	evs := e.Ev.Take()
	if len(evs) != 1 || evs[0].Block == nil || evs[0].Block.BlockHashes[0] != 5 || !evs[0].Block.HasParent ||
		evs[0].Block.ParentHash != 4 || !evs[0].Block.HasLora || evs[0].Block.LoraID != -3 || evs[0].Block.LoraName != "l" ||
		evs[0].Block.BlockSize != 16 || evs[0].Block.TokenIDs[0] != 9 {
		t.Fatalf("events %+v", evs)
	}
	if _, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: pbID(a), Key: "revoked", Size: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutRevoke(ctx, &storepb.PutRevokeRequest{ClientId: pbID(a), Key: "revoked"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.M.QueryKey("revoked"); !errors.Is(err, errcode.ErrObjectNotFound) {
		t.Fatalf("revoked key: %v", err)
	}
	g, err := c.GetReplicaList(ctx, &storepb.GetReplicaListRequest{Key: "k"})
	if err != nil || g.LeaseTtlMs != 10000 || len(g.Replicas) != 1 ||
		g.Replicas[0].Status != storepb.ReplicaStatus_REPLICA_STATUS_COMPLETE ||
		g.Replicas[0].Memory.BufferAddress != ps.Replicas[0].Memory.BufferAddress {
		t.Fatalf("GetReplicaList = %v, %v", g, err)
	}
	if ex, err := c.ExistKey(ctx, &storepb.ExistKeyRequest{Key: "k", NoLease: true}); err != nil || !ex.Exists {
		t.Fatalf("ExistKey = %v, %v", ex, err)
	}
	if _, err := c.ServiceReady(ctx, &storepb.ServiceReadyRequest{}); err != nil {
		t.Fatal(err)
	}

	// Failures arrive as errcode sentinels.
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"get of a missing key", func() error {
			_, err := c.GetReplicaList(ctx, &storepb.GetReplicaListRequest{Key: "missing"})
			return err
		}, errcode.ErrObjectNotFound},
		{"empty key", func() error {
			_, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: pbID(a), Key: "", Size: 1})
			return err
		}, errcode.ErrInvalidKey},
		{"size 0", func() error {
			_, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: pbID(a), Key: "z", Size: 0})
			return err
		}, errcode.ErrInvalidParams},
		{"duplicate put", func() error {
			_, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: pbID(b), Key: "k", Size: 1})
			return err
		}, errcode.ErrObjectAlreadyExists},
		{"invalid replica config", func() error {
			_, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: pbID(a), Key: "z", Size: 1,
				Config: &storepb.ReplicateConfig{ReplicaNum: 1000}})
			return err
		}, errcode.ErrInvalidParams},
		{"soft pin TTL above the maximum", func() error {
			_, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: pbID(a), Key: "z", Size: 1,
				Config: &storepb.ReplicateConfig{WithSoftPin: true, SoftPinTtlMs: 1 << 63}})
			return err
		}, errcode.ErrInvalidParams},
		{"missing client id", func() error {
			_, err := c.PutStart(ctx, &storepb.PutStartRequest{Key: "z", Size: 1})
			return err
		}, errcode.ErrInvalidParams},
		{"PutEnd from another client", func() error {
			if _, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: pbID(a), Key: "p", Size: 10}); err != nil {
				return err
			}
			_, err := c.PutEnd(ctx, &storepb.PutEndRequest{ClientId: pbID(b), Key: "p"})
			return err
		}, errcode.ErrIllegalClient},
		{"PutRevoke of a missing key", func() error {
			_, err := c.PutRevoke(ctx, &storepb.PutRevokeRequest{ClientId: pbID(a), Key: "missing"})
			return err
		}, errcode.ErrObjectNotFound},
		{"PutEnd of a disk replica", func() error {
			_, err := c.PutEnd(ctx, &storepb.PutEndRequest{ClientId: pbID(a), Key: "p", ReplicaType: storepb.ReplicaType_REPLICA_TYPE_DISK})
			return err
		}, errcode.ErrInvalidParams},
		{"Ping without a client id", func() error {
			_, err := c.Ping(ctx, &storepb.PingRequest{})
			return err
		}, errcode.ErrInvalidParams},
		{"Remove while leased", func() error {
			_, err := c.Remove(ctx, &storepb.RemoveRequest{Key: "k"})
			return err
		}, errcode.ErrObjectHasLease},
		{"mount of a known segment", func() error {
			_, err := c.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: pbID(a), Segment: seg})
			return err
		}, errcode.ErrSegmentAlreadyExists},
		{"mount without a segment", func() error {
			_, err := c.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: pbID(a)})
			return err
		}, errcode.ErrInvalidParams},
		{"unmount of an unknown segment", func() error {
			_, err := c.UnmountSegment(ctx, &storepb.UnmountSegmentRequest{ClientId: pbID(a), SegmentId: pbID(master.UUID{Lo: 1})})
			return err
		}, errcode.ErrSegmentNotFound},
		{"status of an unknown segment", func() error {
			_, err := c.QuerySegmentStatus(ctx, &storepb.QuerySegmentStatusRequest{SegmentId: pbID(master.UUID{Lo: 1})})
			return err
		}, errcode.ErrSegmentNotFound},
		{"bad regex", func() error {
			_, err := c.RemoveByRegex(ctx, &storepb.RemoveByRegexRequest{Regex: "["})
			return err
		}, errcode.ErrInvalidParams},
		{"batch with mismatched sizes", func() error {
			_, err := c.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: pbID(a), Keys: []string{"x"}})
			return err
		}, errcode.ErrInvalidParams},
	} {
		err := rpcerr.FromStatus(tc.call())
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}

	// Batches answer per item, in order.
	bps, err := c.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: pbID(a),
		Keys: []string{"b1", "", "k", "b2"}, Sizes: []uint64{10, 10, 10, 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	wantCodes := func(what string, got []int32, want ...errcode.Code) {
		t.Helper()
		for i := range want {
			if i >= len(got) || errcode.Code(got[i]) != want[i] {
				t.Fatalf("%s: codes %v, want %v", what, got, want)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d results, want %d", what, len(got), len(want))
		}
	}
	var codes []int32
	for _, r := range bps.Results {
		codes = append(codes, r.ErrorCode)
	}
	wantCodes("BatchPutStart", codes, errcode.OK, errcode.InvalidKey, errcode.ObjectAlreadyExists, errcode.NoAvailableHandle)
	if len(bps.Results[0].Replicas) != 1 || bps.Results[1].Message == "" {
		t.Fatalf("BatchPutStart results %v", bps.Results)
	}
	bpe, err := c.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: pbID(a), Keys: []string{"b1", "nope", "p"}})
	if err != nil {
		t.Fatal(err)
	}
	codes = nil
	for _, r := range bpe.Results {
		codes = append(codes, r.ErrorCode)
	}
	wantCodes("BatchPutEnd", codes, errcode.OK, errcode.ObjectNotFound, errcode.OK)
	bg, err := c.BatchGetReplicaList(ctx, &storepb.BatchGetReplicaListRequest{Keys: []string{"b1", "nope"}})
	if err != nil {
		t.Fatal(err)
	}
	if bg.Results[0].ErrorCode != 0 || len(bg.Results[0].Replicas) != 1 || bg.Results[0].LeaseTtlMs != 10000 ||
		errcode.Code(bg.Results[1].ErrorCode) != errcode.ObjectNotFound {
		t.Fatalf("BatchGetReplicaList %v", bg.Results)
	}
	be, err := c.BatchExistKey(ctx, &storepb.BatchExistKeyRequest{Keys: []string{"b1", "nope", ""}, NoLease: true})
	if err != nil || !be.Results[0].Exists || be.Results[1].Exists || errcode.Code(be.Results[2].ErrorCode) != errcode.InvalidKey {
		t.Fatalf("BatchExistKey %v %v", be, err)
	}
	if _, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: pbID(a), Key: "rv", Size: 10}); err != nil {
		t.Fatal(err)
	}
	brv, err := c.BatchPutRevoke(ctx, &storepb.BatchPutRevokeRequest{ClientId: pbID(a), Keys: []string{"rv", "b1"}})
	if err != nil || brv.Results[0].ErrorCode != 0 || errcode.Code(brv.Results[1].ErrorCode) != errcode.InvalidWrite {
		t.Fatalf("BatchPutRevoke %v %v", brv, err)
	}
	br, err := c.BatchRemove(ctx, &storepb.BatchRemoveRequest{Keys: []string{"b1", "nope"}})
	if err != nil || errcode.Code(br.Results[0].ErrorCode) != errcode.ObjectHasLease || errcode.Code(br.Results[1].ErrorCode) != errcode.ObjectNotFound {
		t.Fatalf("BatchRemove %v %v", br, err)
	}
	if _, err := c.Remove(ctx, &storepb.RemoveRequest{Key: "b1", Force: true}); err != nil {
		t.Fatal(err)
	}
	rr, err := c.RemoveByRegex(ctx, &storepb.RemoveByRegexRequest{Regex: "p", Force: true})
	if err != nil || rr.Removed != 1 {
		t.Fatalf("RemoveByRegex %v %v", rr, err)
	}
	ra, err := c.RemoveAll(ctx, &storepb.RemoveAllRequest{Force: true})
	if err != nil || ra.Removed != 1 {
		t.Fatalf("RemoveAll %v %v", ra, err)
	}
	// Remount is idempotent; unmount drops the segment.
	if _, err := c.ReMountSegment(ctx, &storepb.ReMountSegmentRequest{ClientId: pbID(a), Segments: []*storepb.Segment{seg}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UnmountSegment(ctx, &storepb.UnmountSegmentRequest{ClientId: pbID(a), SegmentId: seg.Id}); err != nil {
		t.Fatal(err)
	}
	if segs := e.M.AllSegments(); len(segs) != 0 {
		t.Fatalf("segments after unmount %v", segs)
	}

	counts := map[string]RPCCount{}
	for _, rc := range svc.Counts() {
		counts[rc.Name] = rc
	}
	if pc := counts["put_start"]; pc.Requests != 10 || pc.Failures != 6 {
		t.Fatalf("put_start counters %+v", pc)
	}
	if bc := counts["batch_put_start"]; bc.Requests != 2 || bc.Failures != 1 || bc.Items != 4 || bc.ItemFailures != 3 {
		t.Fatalf("batch_put_start counters %+v", bc)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, rc := range svc.Counts() {
		if uint64(observed[rc.Name]) != rc.Requests {
			t.Errorf("%s: observed %d, counted %d", rc.Name, observed[rc.Name], rc.Requests)
		}
	}
	if len(RPCNames()) != len(storepb.Master_ServiceDesc.Methods) {
		t.Fatal("RPC names")
	}
}

// TestServeStops checks Serve returns on cancel with a connection still
// open, and reports a listener that fails.
func TestServeStops(t *testing.T) {
	e := mastertest.New(t, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, lis, e.M) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	if _, err := storepb.NewMasterClient(conn).ServiceReady(rctx, &storepb.ServiceReadyRequest{}); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	// A closed listener is an error.
	lis2, _ := net.Listen("tcp", "127.0.0.1:0")
	lis2.Close()
	if err := Serve(context.Background(), lis2, e.M); err == nil {
		t.Fatal("Serve on a closed listener succeeded")
	}
}

// TestServiceReserveCommit: the one-round-trip put over gRPC: reserve,
// commit with a replacement asked for in the same call, give back.
func TestServiceReserveCommit(t *testing.T) {
	e := mastertest.New(t, func(c *master.Config) { c.PutDiscardTimeout = 20 * time.Second })
	c, svc := serve(t, e.M)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.Mount(mastertest.Client(1), "host:1", 8<<20)
	a := pbID(mastertest.Client(1))
	spec := &storepb.ReserveSpec{Size: 4096, Config: &storepb.ReplicateConfig{ReplicaNum: 1}, Count: 2}
	rr, err := c.ReservePut(ctx, &storepb.ReservePutRequest{ClientId: a, Specs: []*storepb.ReserveSpec{spec,
		{Size: 0, Count: 1}, {Size: 1, Count: 1000}}})
	if err != nil || len(rr.Results) != 3 || rr.TtlMs != 20000 {
		t.Fatalf("ReservePut = %v, %v", rr, err)
	}
	got := rr.Results[0].Reservations
	if len(got) != 2 || got[0].Size != 4096 || len(got[0].Replicas) != 1 || got[0].Replicas[0].Memory.SegmentName != "host:1" {
		t.Fatalf("reservations %v", got)
	}
	for _, bad := range rr.Results[1:] {
		if errcode.Code(bad.ErrorCode) != errcode.InvalidParams || len(bad.Reservations) != 0 {
			t.Fatalf("bad spec answered %v", bad)
		}
	}
	cr, err := c.CommitPut(ctx, &storepb.CommitPutRequest{ClientId: a,
		Items: []*storepb.CommitItem{
			{Key: "k1", ReservationId: got[0].Id, Block: &storepb.BlockMetadata{BlockHashes: []uint64{1}}},
			{Key: "k1", ReservationId: got[1].Id}, // the key was just taken
		},
		Reserve: []*storepb.ReserveSpec{{Size: 4096, Config: spec.Config, Count: 1}}})
	if err != nil || len(cr.Results) != 2 || len(cr.Reserved) != 1 || cr.TtlMs != 20000 {
		t.Fatalf("CommitPut = %v, %v", cr, err)
	}
	if cr.Results[0].ErrorCode != 0 || errcode.Code(cr.Results[1].ErrorCode) != errcode.ObjectAlreadyExists {
		t.Fatalf("commit results %v", cr.Results)
	}
	if n := len(cr.Reserved[0].Reservations); n != 1 {
		t.Fatalf("replacement: %v", cr.Reserved)
	}
	if gl, err := c.GetReplicaList(ctx, &storepb.GetReplicaListRequest{Key: "k1"}); err != nil ||
		gl.Replicas[0].Memory.BufferAddress != got[0].Replicas[0].Memory.BufferAddress {
		t.Fatalf("k1 = %v, %v", gl, err)
	}
	// Give both outstanding back in an empty ReservePut.
	if _, err := c.ReservePut(ctx, &storepb.ReservePutRequest{ClientId: a,
		Release: []uint64{got[1].Id, cr.Reserved[0].Reservations[0].Id}}); err != nil {
		t.Fatal(err)
	}
	if st := e.M.Stats(); st.Reservations != 0 || st.Keys != 1 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := c.CommitPut(ctx, &storepb.CommitPutRequest{Items: []*storepb.CommitItem{{Key: "x"}}}); !errors.Is(rpcerr.FromStatus(err), errcode.ErrInvalidParams) {
		t.Fatalf("no client id: %v", err)
	}
	for _, rc := range svc.Counts() {
		switch rc.Name {
		case "reserve_put":
			if rc.Requests != 2 || rc.Items != 3 || rc.ItemFailures != 2 {
				t.Fatalf("reserve_put counters %+v", rc)
			}
		case "commit_put":
			if rc.Requests != 2 || rc.Failures != 1 || rc.Items != 2 || rc.ItemFailures != 1 {
				t.Fatalf("commit_put counters %+v", rc)
			}
		}
	}
	require.NoError(t, e.M.CheckInvariants())
}

// serveBoth serves svc as crescent-master does (gRPC and crpc on one
// port) and returns the address; cleanup stops it.
func serveBoth(t *testing.T, svc *Service) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return lis.Addr().String()
}

// TestInterceptorCountsBoth: the service's one interceptor counts and
// observes RPCs over gRPC and over crpc alike (batch items included), and
// a crpc interceptor given to WithCRPC runs around it.
func TestInterceptorCountsBoth(t *testing.T) {
	e := mastertest.New(t, nil)
	var mu sync.Mutex
	observed := map[string]int{}
	var crpcSeen []string
	svc := New(e.M,
		WithObserver(func(rpc string, _ time.Duration, _ error) {
			mu.Lock()
			observed[rpc]++
			mu.Unlock()
		}),
		WithCRPC(crpc.ServerConfig{Interceptor: func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			mu.Lock()
			crpcSeen = append(crpcSeen, info.FullMethod)
			mu.Unlock()
			return h(ctx, req)
		}}, netx.Config{}))
	addr := serveBoth(t, svc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer gc.Close()
	cc, err := crpc.Dial(ctx, addr)
	require.NoError(t, err)
	defer cc.Close()
	for _, c := range []storepb.MasterClient{storepb.NewMasterClient(gc), storepb.NewMasterClient(cc)} {
		_, err := c.ServiceReady(ctx, &storepb.ServiceReadyRequest{})
		require.NoError(t, err)
		_, err = c.PutStart(ctx, &storepb.PutStartRequest{Key: "k", Size: 1})
		require.Error(t, err) // no client id
		r, err := c.BatchExistKey(ctx, &storepb.BatchExistKeyRequest{Keys: []string{"a", "b", ""}})
		require.NoError(t, err)
		require.Len(t, r.Results, 3)
	}
	counts := map[string]RPCCount{}
	for _, rc := range svc.Counts() {
		counts[rc.Name] = rc
	}
	assert.Equal(t, RPCCount{Name: "service_ready", Requests: 2}, counts["service_ready"])
	assert.Equal(t, RPCCount{Name: "put_start", Requests: 2, Failures: 2}, counts["put_start"])
	assert.Equal(t, RPCCount{Name: "batch_exist_key", Requests: 2, Items: 6, ItemFailures: 2}, counts["batch_exist_key"])
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"service_ready": 2, "put_start": 2, "batch_exist_key": 2}, observed)
	assert.Equal(t, []string{storepb.Master_ServiceReady_FullMethodName, storepb.Master_PutStart_FullMethodName,
		storepb.Master_BatchExistKey_FullMethodName}, crpcSeen)
}

// TestServeFDExhaustion: the master's RPC port keeps serving through
// EMFILE on accept: once fds are back, a crpc and a gRPC call succeed.
func TestServeFDExhaustion(t *testing.T) {
	e := mastertest.New(t, nil)
	addr := serveBoth(t, New(e.M))
	finish := netx.StarveWithPeer(t, addr) // a peer left in the backlog
	time.Sleep(50 * time.Millisecond)      // several failed accepts
	finish()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, err := crpc.Dial(ctx, addr)
	require.NoError(t, err)
	defer cc.Close()
	_, err = storepb.NewMasterClient(cc).ServiceReady(ctx, &storepb.ServiceReadyRequest{})
	require.NoError(t, err)
	gc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer gc.Close()
	_, err = storepb.NewMasterClient(gc).ServiceReady(ctx, &storepb.ServiceReadyRequest{})
	require.NoError(t, err)
}

// TestServiceMountRefusesOverlap runs the sequence through gRPC.
func TestServiceMountRefusesOverlap(t *testing.T) {
	e := mastertest.New(t, nil)
	c, _ := serve(t, e.M)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := mastertest.Client(1), mastertest.Client(2)
	seg := func(id uint64, base, size uint64) *storepb.Segment {
		return &storepb.Segment{Id: pbID(master.UUID{Lo: id}), Name: "host:1", Base: base, Size: size, Protocol: "tcp"}
	}
	_, err := c.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: pbID(a), Segment: seg(1, 1<<30, 1<<20)})
	require.NoError(t, err)
	_, err = c.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: pbID(b), Segment: seg(2, 1<<30, 1<<20)})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrSegmentAlreadyExists)
	_, err = c.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: pbID(b), Segment: seg(3, 1<<30+4096, 1<<20)})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrSegmentAlreadyExists)
	_, err = c.ReMountSegment(ctx, &storepb.ReMountSegmentRequest{ClientId: pbID(b), Segments: []*storepb.Segment{seg(4, 1<<30-4096, 8192)}})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrSegmentAlreadyExists)
	_, err = c.ReMountSegment(ctx, &storepb.ReMountSegmentRequest{ClientId: pbID(a), Segments: []*storepb.Segment{seg(1, 1<<30, 1<<20)}})
	require.NoError(t, err, "a remount by the owner is idempotent")
	require.Len(t, e.M.AllSegments(), 1)
	_, err = c.UnmountSegment(ctx, &storepb.UnmountSegmentRequest{ClientId: pbID(a), SegmentId: pbID(master.UUID{Lo: 1})})
	require.NoError(t, err)
	_, err = c.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: pbID(b), Segment: seg(2, 1<<30, 1<<20)})
	require.NoError(t, err)
}

// TestServiceStalePutEnd runs the take-over through gRPC.
func TestServiceStalePutEnd(t *testing.T) {
	e := mastertest.New(t, nil)
	c, _ := serve(t, e.M)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := mastertest.Client(1)
	e.Mount(a, "host:1", 1<<20)
	s1, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: pbID(a), Key: "k", Size: 100})
	require.NoError(t, err)
	require.NotZero(t, s1.Generation)
	e.Clk.Advance(e.M.Config().PutDiscardTimeout)
	b1, err := c.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: pbID(a), Keys: []string{"k"}, Sizes: []uint64{100}})
	require.NoError(t, err)
	g2 := b1.Results[0].Generation
	require.NotZero(t, g2)
	require.NotEqual(t, s1.Generation, g2)

	_, err = c.PutEnd(ctx, &storepb.PutEndRequest{ClientId: pbID(a), Key: "k", Generation: s1.Generation})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrReplicaIsGone)
	_, err = c.PutRevoke(ctx, &storepb.PutRevokeRequest{ClientId: pbID(a), Key: "k", Generation: s1.Generation})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrReplicaIsGone)
	be, err := c.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: pbID(a), Keys: []string{"k"}, Generations: []uint64{s1.Generation}})
	require.NoError(t, err)
	require.Equal(t, int32(errcode.ReplicaIsGone), be.Results[0].ErrorCode)
	br, err := c.BatchPutRevoke(ctx, &storepb.BatchPutRevokeRequest{ClientId: pbID(a), Keys: []string{"k"}, Generations: []uint64{s1.Generation}})
	require.NoError(t, err)
	require.Equal(t, int32(errcode.ReplicaIsGone), br.Results[0].ErrorCode)
	_, err = c.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: pbID(a), Keys: []string{"k"}, Generations: []uint64{1, 2}})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrInvalidParams)
	_, err = c.BatchPutRevoke(ctx, &storepb.BatchPutRevokeRequest{ClientId: pbID(a), Keys: []string{"k"}, Generations: []uint64{1, 2}})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrInvalidParams)
	require.False(t, e.Exists("k"))

	_, err = c.PutEnd(ctx, &storepb.PutEndRequest{ClientId: pbID(a), Key: "k", Generation: g2})
	require.NoError(t, err)
	require.True(t, e.Exists("k"))
}

// TestServiceRemoveByRegexBounds: through gRPC the refusal is
// INVALID_PARAMS with a short message.
func TestServiceRemoveByRegexBounds(t *testing.T) {
	e := mastertest.New(t, nil)
	c, _ := serve(t, e.M)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.RemoveByRegex(ctx, &storepb.RemoveByRegexRequest{Regex: strings.Repeat("(.*){1000}x", 100)})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrInvalidParams)
	require.Less(t, len(err.Error()), 300)
	_, err = c.RemoveByRegex(ctx, &storepb.RemoveByRegexRequest{Regex: `(.*){1000}x`})
	require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrInvalidParams)
}

// TestInvalidUTF8Refused: a crpc peer's encoder does not check strings,
// so the master's decoder must: a key that is not UTF-8 is refused with
// InvalidArgument naming the field, and the connection goes on serving.
func TestInvalidUTF8Refused(t *testing.T) {
	e := mastertest.New(t, nil)
	addr := serveBoth(t, New(e.M, WithCRPC(crpc.ServerConfig{}, netx.Config{})))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, err := crpc.Dial(ctx, addr)
	require.NoError(t, err)
	defer cc.Close()
	c := storepb.NewMasterClient(cc)
	_, err = c.BatchExistKey(ctx, &storepb.BatchExistKeyRequest{Keys: []string{"ok", "bad\xff"}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "BatchExistKeyRequest.keys: invalid UTF-8")
	_, err = c.PutStart(ctx, &storepb.PutStartRequest{Key: "k\xc3", Size: 1, Config: &storepb.ReplicateConfig{PreferredSegments: []string{"s"}}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	r, err := c.BatchExistKey(ctx, &storepb.BatchExistKeyRequest{Keys: []string{"ok", "ségment"}})
	require.NoError(t, err)
	require.Len(t, r.Results, 2)
}

// TestBatchItemsBounded: a batch of more than storepb.MaxBatchItems items
// is refused with INVALID_PARAMS by every batch RPC (the master would
// otherwise size its arrays by a count the peer chose); a batch of
// exactly the bound is served.
func TestBatchItemsBounded(t *testing.T) {
	e := mastertest.New(t, nil)
	c, _ := serve(t, e.M)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := pbID(mastertest.Client(1))
	keys := func(n int) []string {
		ks := make([]string, n)
		for i := range ks {
			ks[i] = "k" + strconv.Itoa(i)
		}
		return ks
	}
	calls := map[string]func(n int) error{
		"BatchPutStart": func(n int) error {
			_, err := c.BatchPutStart(ctx, &storepb.BatchPutStartRequest{ClientId: id, Keys: keys(n), Sizes: make([]uint64, n)})
			return err
		},
		"BatchPutEnd": func(n int) error {
			_, err := c.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{ClientId: id, Keys: keys(n)})
			return err
		},
		"BatchPutRevoke": func(n int) error {
			_, err := c.BatchPutRevoke(ctx, &storepb.BatchPutRevokeRequest{ClientId: id, Keys: keys(n)})
			return err
		},
		"CommitPut": func(n int) error {
			items := make([]*storepb.CommitItem, n)
			for i, k := range keys(n) {
				items[i] = &storepb.CommitItem{Key: k, ReservationId: uint64(i + 1)}
			}
			_, err := c.CommitPut(ctx, &storepb.CommitPutRequest{ClientId: id, Items: items})
			return err
		},
		"BatchGetReplicaList": func(n int) error {
			_, err := c.BatchGetReplicaList(ctx, &storepb.BatchGetReplicaListRequest{Keys: keys(n)})
			return err
		},
		"BatchExistKey": func(n int) error {
			_, err := c.BatchExistKey(ctx, &storepb.BatchExistKeyRequest{Keys: keys(n)})
			return err
		},
		"BatchRemove": func(n int) error {
			_, err := c.BatchRemove(ctx, &storepb.BatchRemoveRequest{Keys: keys(n)})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			err := call(storepb.MaxBatchItems + 1)
			require.ErrorIs(t, rpcerr.FromStatus(err), errcode.ErrInvalidParams, "%v", err)
			assert.Contains(t, err.Error(), "items in one batch")
			// At the bound: served (items fail one by one, not the call).
			require.NoError(t, call(storepb.MaxBatchItems))
		})
	}
}
