package service

import (
	"context"
	"crypto/tls"
	"errors"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/crescent-kv/crescent/internal/crpc"
	"github.com/crescent-kv/crescent/internal/h2bound"
	"github.com/crescent-kv/crescent/internal/netx"
	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/master"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// RPC names, as used in metric names (master_<rpc>_requests_total).
const (
	rpcPutStart = iota
	rpcPutEnd
	rpcPutRevoke
	rpcBatchPutStart
	rpcBatchPutEnd
	rpcBatchPutRevoke
	rpcGetReplicaList
	rpcBatchGetReplicaList
	rpcExistKey
	rpcBatchExistKey
	rpcRemove
	rpcBatchRemove
	rpcRemoveByRegex
	rpcRemoveAll
	rpcMountSegment
	rpcReMountSegment
	rpcUnmountSegment
	rpcQuerySegmentStatus
	rpcPing
	rpcServiceReady
	rpcReservePut
	rpcCommitPut
	rpcReportFailedSegments
	rpcWaitInvalidations
	numRPC
)

var rpcNames = [numRPC]string{
	"put_start", "put_end", "put_revoke", "batch_put_start", "batch_put_end", "batch_put_revoke",
	"get_replica_list", "batch_get_replica_list", "exist_key", "batch_exist_key",
	"remove", "batch_remove", "remove_by_regex", "remove_all",
	"mount_segment", "remount_segment", "unmount_segment", "query_segment_status",
	"ping", "service_ready", "reserve_put", "commit_put", "report_failed_segments",
	"wait_invalidations",
}

// RPCNames lists the names RPCCount and observers use, in a fixed order.
func RPCNames() []string { return append([]string(nil), rpcNames[:]...) }

// RPCCount is one RPC's counters. Requests and Failures count calls (a
// failure is an RPC answered with an error status); Items and
// ItemFailures count the items of batch RPCs that succeeded as a whole.
type RPCCount struct {
	Name                                    string
	Requests, Failures, Items, ItemFailures uint64
	// With an operation log: how many answers waited for their changes
	// (or, for a read, the changes it saw) to be durable, and the total
	// time they waited, the log's share of the RPC's latency.
	DurableWaits, DurableWaitNanos uint64
}

type rpcCounter struct {
	requests, failures, items, itemFailures atomic.Uint64
	durableWaits, durableWaitNanos          atomic.Uint64
}

// Service is the gRPC face of a Master: it converts messages, calls the
// core and maps errors with rpcerr.ToStatus; batch RPCs answer per item.
type Service struct {
	storepb.UnimplementedMasterServer
	m       *master.Master
	counts  [numRPC]rpcCounter
	observe func(rpc string, d time.Duration, err error)
	grace   time.Duration
	crpc    crpc.ServerConfig
	conns   netx.Config
	durable func(ctx context.Context) error // nil: no log to wait for
	health  func() error
	// lastChange and waitSeq, when set, replace durable for reads of
	// keys (WithReadDurability).
	lastChange func(key string) uint64
	waitSeq    func(ctx context.Context, seq uint64) error
	gate       func() error // nil: always answer
	// admin is the admin credential; adminSet: admin RPCs need it
	// (WithAdminToken).
	admin    []byte
	adminSet bool
	// Transport security (WithTransportSecurity).
	tls   *tls.Config
	token []byte
	allow func(net.Addr) bool
	// h2 counts the gRPC requests' bytes of the latest Serve.
	h2 atomic.Pointer[h2bound.Bound]
	// calls counts the gRPC calls open of the latest Serve.
	calls atomic.Pointer[callBound]
}

// Option configures New.
type Option func(*Service)

// WithObserver calls fn after every RPC with its name, duration and the
// error returned to the caller: nil on success (batch RPCs succeed as a
// whole even when items fail), else a gRPC status from which
// rpcerr.FromStatus recovers the store code. fn must be quick and safe
// for concurrent use.
func WithObserver(fn func(rpc string, d time.Duration, err error)) Option {
	return func(s *Service) { s.observe = fn }
}

// WithGracePeriod bounds how long Serve waits for RPCs in flight when its
// context ends (default 5s) before closing connections.
func WithGracePeriod(d time.Duration) Option { return func(s *Service) { s.grace = d } }

// WithCRPC configures Serve's crpc server (frame size, calls in flight,
// timeouts; its Interceptor is the service's own, chained after any
// given) and, with conns, the port's accept loop (connection caps). Its
// TLS, when set, makes the whole port TLS: gRPC and crpc alike, the
// handshake before the split (crpc.SplitTLS).
func WithCRPC(cfg crpc.ServerConfig, conns netx.Config) Option {
	return func(s *Service) { s.crpc, s.conns = cfg, conns }
}

// WithDurability makes every RPC answer only once wait returns nil: wait
// blocks until everything the master logged so far is durable (a read
// that saw a change must not be answered before the change is durable
// either) and returns at once when nothing is pending. When wait fails
// the RPC answers INTERNAL_ERROR with the cause (or the caller's context error) instead of its result.
// failed, when set, reports the log's failure (nil while healthy): the
// admin /health answers 503 with it (fail-stop). A wait about to block
// calls crpc.Detach(ctx) first: a crpc call may be running on its
// connection's reader (ServerConfig.Inline), whose other calls would
// wait behind it. The same goes for WithReadDurability's waitSeq.
func WithDurability(wait func(ctx context.Context) error, failed func() error) Option {
	return func(s *Service) { s.durable, s.health = wait, failed }
}

// WithReadDurability lets the reads of keys (GetReplicaList,
// ExistKey and their batch forms) wait for less than WithDurability's
// wait: only until waitSeq(max of lastChange(key) over the keys read)
// returns. lastChange(key) must be at or after the seq of every change
// to key the master made before the read returned (a durable master
// logs a change while it holds the key's lock), so a read that saw a
// change is still not answered before it is durable, but it does not
// wait for the commits of other keys' writes.
func WithReadDurability(lastChange func(key string) uint64, waitSeq func(ctx context.Context, seq uint64) error) Option {
	return func(s *Service) { s.lastChange, s.waitSeq = lastChange, waitSeq }
}

// readNeed is the seq a read of keys must wait for; false when req is
// not one (its request type names the RPC).
func (s *Service) readNeed(req any) (uint64, bool) {
	if s.lastChange == nil || s.waitSeq == nil {
		return 0, false
	}
	var keys []string
	switch r := req.(type) {
	case *storepb.GetReplicaListRequest:
		return s.lastChange(r.GetKey()), true
	case *storepb.ExistKeyRequest:
		return s.lastChange(r.GetKey()), true
	case *storepb.BatchGetReplicaListRequest:
		keys = r.GetKeys()
	case *storepb.BatchExistKeyRequest:
		keys = r.GetKeys()
	default:
		return 0, false
	}
	var need uint64
	for _, k := range keys {
		need = max(need, s.lastChange(k))
	}
	return need, true
}

// WithGate makes every RPC check gate just before it answers: a non-nil
// error replaces the answer with UNAVAILABLE carrying it. An HA leader
// passes its lease (the session's deadline), so that a master that may
// no longer lead answers nothing, not even a read, from then on.
func WithGate(gate func() error) Option { return func(s *Service) { s.gate = gate } }

// WaitDurable returns once every change the master made so far is
// durable (at once without a log, or when nothing is pending), the
// log's failure, or ctx's error: what a reader outside the RPCs (the
// admin HTTP pages) waits for before showing state.
func (s *Service) WaitDurable(ctx context.Context) error {
	if s == nil || s.durable == nil {
		return nil
	}
	return s.durable(ctx)
}

// Healthy is nil unless the durability hook reports a failure.
func (s *Service) Healthy() error {
	if s == nil || s.health == nil {
		return nil
	}
	return s.health()
}

// New returns the gRPC service for m.
func New(m *master.Master, opts ...Option) *Service {
	s := &Service{m: m, grace: 5 * time.Second}
	for _, o := range opts {
		o(s)
	}
	return s
}

var _ storepb.MasterServer = (*Service)(nil)

// Counts returns every RPC's counters, in RPCNames order.
func (s *Service) Counts() []RPCCount {
	out := make([]RPCCount, numRPC)
	for i := range out {
		c := &s.counts[i]
		out[i] = RPCCount{Name: rpcNames[i], Requests: c.requests.Load(), Failures: c.failures.Load(),
			Items: c.items.Load(), ItemFailures: c.itemFailures.Load(),
			DurableWaits: c.durableWaits.Load(), DurableWaitNanos: c.durableWaitNanos.Load()}
	}
	return out
}

// Register adds the service to a gRPC server (or a crpc one). Install
// UnaryInterceptor on that server too, or the RPCs are not counted.
func (s *Service) Register(g grpc.ServiceRegistrar) { storepb.RegisterMasterServer(g, s) }

// GRPCRequestBytes is the gRPC request bytes held now under the byte
// bound of the latest Serve, and the calls it refused (REFUSED_STREAM)
// so far; zeros before Serve.
func (s *Service) GRPCRequestBytes() (held, refused int64) {
	if b := s.h2.Load(); b != nil {
		return b.Held(), b.Refused()
	}
	return 0, 0
}

// GRPCWindowsStarved is the gRPC connections the latest Serve closed
// because their client kept a flow-control window shut while answers
// waited on it for the write timeout (0 before Serve).
func (s *Service) GRPCWindowsStarved() int64 {
	if b := s.h2.Load(); b != nil {
		return b.Starved()
	}
	return 0
}

// GRPCCallsRefused is the gRPC calls the latest Serve answered
// RESOURCE_EXHAUSTED because its bound on calls open was spent (0
// before Serve).
func (s *Service) GRPCCallsRefused() int64 {
	if b := s.calls.Load(); b != nil {
		return b.refused.Load()
	}
	return 0
}

// rpcOf maps a full method name to its counters.
var rpcOf = map[string]int{
	storepb.Master_PutStart_FullMethodName: rpcPutStart, storepb.Master_PutEnd_FullMethodName: rpcPutEnd,
	storepb.Master_PutRevoke_FullMethodName: rpcPutRevoke, storepb.Master_BatchPutStart_FullMethodName: rpcBatchPutStart,
	storepb.Master_BatchPutEnd_FullMethodName: rpcBatchPutEnd, storepb.Master_BatchPutRevoke_FullMethodName: rpcBatchPutRevoke,
	storepb.Master_GetReplicaList_FullMethodName: rpcGetReplicaList, storepb.Master_BatchGetReplicaList_FullMethodName: rpcBatchGetReplicaList,
	storepb.Master_ExistKey_FullMethodName: rpcExistKey, storepb.Master_BatchExistKey_FullMethodName: rpcBatchExistKey,
	storepb.Master_Remove_FullMethodName: rpcRemove, storepb.Master_BatchRemove_FullMethodName: rpcBatchRemove,
	storepb.Master_RemoveByRegex_FullMethodName: rpcRemoveByRegex, storepb.Master_RemoveAll_FullMethodName: rpcRemoveAll,
	storepb.Master_MountSegment_FullMethodName: rpcMountSegment, storepb.Master_ReMountSegment_FullMethodName: rpcReMountSegment,
	storepb.Master_UnmountSegment_FullMethodName: rpcUnmountSegment, storepb.Master_QuerySegmentStatus_FullMethodName: rpcQuerySegmentStatus,
	storepb.Master_Ping_FullMethodName: rpcPing, storepb.Master_ServiceReady_FullMethodName: rpcServiceReady,
	storepb.Master_ReservePut_FullMethodName: rpcReservePut, storepb.Master_CommitPut_FullMethodName: rpcCommitPut,
	storepb.Master_ReportFailedSegments_FullMethodName: rpcReportFailedSegments,
	storepb.Master_WaitInvalidations_FullMethodName:    rpcWaitInvalidations,
}

// inline is the crpc server's ServerConfig.Inline: the service's calls
// run on their connection's reader while no invalidation barrier can
// make them wait (the durability waits Detach first), except the long
// poll and the admin removals that scan every key.
func (s *Service) inline(method string) func() bool {
	switch method {
	case storepb.Master_WaitInvalidations_FullMethodName, storepb.Master_RemoveByRegex_FullMethodName,
		storepb.Master_RemoveAll_FullMethodName:
		return nil
	}
	if _, ok := rpcOf[method]; !ok {
		return nil
	}
	return s.m.BarrierFree
}

// UnaryInterceptor counts every RPC of the service (Counts) and reports
// it to the observer: the one place per-RPC metrics live, for the gRPC
// and the crpc server alike (Serve installs it on both).
func (s *Service) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		rpc, ok := rpcOf[info.FullMethod]
		if !ok {
			return h(ctx, req)
		}
		start := time.Now()
		if err := s.authorize(rpc, req); err != nil {
			s.done(rpc, start, err, 0, 0)
			return nil, err
		}
		resp, err := h(ctx, req)
		if s.durable != nil {
			// Answer nothing (success or failure) from a state that is
			// not durable yet: for a read of keys, their last changes
			// (read after the handler, so they cover what it saw).
			var werr error
			w0 := time.Now()
			if need, ok := s.readNeed(req); ok {
				werr = s.waitSeq(ctx, need)
			} else {
				werr = s.durable(ctx)
			}
			c := &s.counts[rpc]
			c.durableWaits.Add(1)
			c.durableWaitNanos.Add(uint64(time.Since(w0)))
			if werr != nil {
				if ctx.Err() == nil {
					werr = &errcode.Error{Code: errcode.InternalError, Msg: "master: operation log not durable: " + werr.Error()}
				}
				resp, err = nil, rpcerr.ToStatus(werr)
			}
		}
		if s.gate != nil {
			if gerr := s.gate(); gerr != nil {
				resp, err = nil, status.Error(codes.Unavailable, "master: "+gerr.Error())
			}
		}
		items, bad := batchItems(resp)
		s.done(rpc, start, err, items, bad)
		return resp, err
	}
}

type coded interface{ GetErrorCode() int32 }

func countItems[T coded](rs []T) (items, bad int) {
	for _, r := range rs {
		if r.GetErrorCode() != 0 {
			bad++
		}
	}
	return len(rs), bad
}

// batchItems counts a batch answer's items and those that failed.
func batchItems(resp any) (items, bad int) {
	switch r := resp.(type) {
	case *storepb.BatchPutStartResponse:
		return countItems(r.GetResults())
	case *storepb.BatchPutEndResponse:
		return countItems(r.GetResults())
	case *storepb.BatchPutRevokeResponse:
		return countItems(r.GetResults())
	case *storepb.BatchGetReplicaListResponse:
		return countItems(r.GetResults())
	case *storepb.BatchExistKeyResponse:
		return countItems(r.GetResults())
	case *storepb.BatchRemoveResponse:
		return countItems(r.GetResults())
	case *storepb.ReservePutResponse:
		return countItems(r.GetResults())
	case *storepb.CommitPutResponse:
		return countItems(r.GetResults())
	}
	return 0, 0
}

// Serve serves the service on lis until ctx ends, then stops gracefully
// (bounded by the grace period). Each connection is served as gRPC or, when
// it opens with crpc's preface, as crpc (internal/crpc: the same service
// over a lighter framing, which store clients prefer). opts configure the
// gRPC server; both servers count RPCs through UnaryInterceptor. It
// returns nil after ctx ends, else the first server error. It does not
// Start or Close the Master.
func (s *Service) Serve(ctx context.Context, lis net.Listener, opts ...grpc.ServerOption) error {
	ic := s.UnaryInterceptor()
	tc, conns := s.crpc.TLS, s.conns
	if s.tls != nil {
		tc = s.tls
	}
	if s.allow != nil {
		conns.Allow = s.allow
	}
	cl, gl := crpc.SplitAuth(lis, conns, tc, s.token)
	// The bounds first: opts given by the caller override them.
	bounds, calls := grpcBounds(s.crpc)
	s.calls.Store(calls)
	gopts := append(append(bounds, opts...), grpc.ChainUnaryInterceptor(ic))
	if tc != nil {
		// The split did the handshake; these show its state to handlers.
		gopts = append(gopts, grpc.Creds(crpc.Credentials()))
	}
	g := grpc.NewServer(gopts...)
	s.Register(g)
	cfg := s.crpc
	if prev := cfg.Interceptor; prev != nil {
		cfg.Interceptor = func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return prev(ctx, req, info, func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, h) })
		}
	} else {
		cfg.Interceptor = ic
	}
	if cfg.Inline == nil {
		cfg.Inline = s.inline
	}
	c := crpc.NewServer(cfg)
	s.Register(c)
	errc := make(chan error, 2)
	// gRPC reads each request whole before its handler runs: its
	// requests' bytes across connections are bounded as crpc's are.
	maxBuf, stall := s.crpc.ByteBounds()
	// And a client that stops reading loses its connection, as crpc's,
	// as does one that starves its answers by keeping its flow-control
	// window shut (h2bound follows the send windows).
	hb := h2bound.New(h2bound.Config{MaxBytes: maxBuf, Stall: stall, WriteTimeout: s.crpc.WriteBound()})
	s.h2.Store(hb)
	go func() { errc <- g.Serve(hb.Listener(gl)) }()
	go func() { errc <- c.Serve(cl) }()
	var first error
	select {
	case first = <-errc:
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); g.GracefulStop() }()
		go func() { defer wg.Done(); c.GracefulStop() }()
		wg.Wait()
		close(stopped)
	}()
	t := time.NewTimer(s.grace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		g.Stop()
		c.Stop()
		<-stopped
	}
	errs := []error{first}
	if first == nil {
		errs[0] = <-errc
	}
	errs = append(errs, <-errc)
	for _, err := range errs {
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, crpc.ErrServerStopped) {
			return err
		}
	}
	return nil
}

// Serve is New(m).Serve(ctx, lis, opts...).
func Serve(ctx context.Context, lis net.Listener, m *master.Master, opts ...grpc.ServerOption) error {
	return New(m).Serve(ctx, lis, opts...)
}

// done records one RPC; items and bad count batch items.
func (s *Service) done(rpc int, start time.Time, err error, items, bad int) {
	c := &s.counts[rpc]
	c.requests.Add(1)
	if err != nil {
		c.failures.Add(1)
	}
	if items > 0 && err == nil {
		c.items.Add(uint64(items))
		c.itemFailures.Add(uint64(bad))
	}
	if s.observe != nil {
		s.observe(rpcNames[rpc], time.Since(start), err)
	}
}

func fromPB(u *storepb.UUID) master.UUID {
	if u == nil {
		return master.UUID{}
	}
	return master.UUID{Hi: u.High, Lo: u.Low}
}

func toPB(u master.UUID) *storepb.UUID { return &storepb.UUID{High: u.Hi, Low: u.Lo} }

func clientID(u *storepb.UUID) (master.UUID, error) {
	if u == nil {
		return master.UUID{}, errcode.New(errcode.InvalidParams, "client_id missing")
	}
	return fromPB(u), nil
}

func configFromPB(c *storepb.ReplicateConfig) (master.ReplicateConfig, error) {
	if c == nil {
		return master.ReplicateConfig{}, nil
	}
	if c.ReplicaNum > math.MaxInt32 || c.MinReplicas > math.MaxInt32 {
		return master.ReplicateConfig{}, errcode.New(errcode.InvalidParams, "replica_num %d, min_replicas %d", c.ReplicaNum, c.MinReplicas)
	}
	rc := master.ReplicateConfig{Replicas: int(c.ReplicaNum), SoftPin: c.WithSoftPin, HardPin: c.WithHardPin,
		Preferred: c.PreferredSegments, SameNode: c.PreferAllocInSameNode, MinReplicas: int(c.MinReplicas)}
	if c.WithSoftPin && c.SoftPinTtlMs > 0 {
		// Saturate: anything this large is above any maximum anyway.
		rc.SoftPinTTL = time.Duration(min(c.SoftPinTtlMs, math.MaxInt64/uint64(time.Millisecond))) * time.Millisecond
	}
	return rc, nil
}

// packMin is the fewest entries packed: for one entry the columns cost
// more than its messages (encoded, decoded and unpacked: 3.1 µs packed,
// 2.2 unpacked), from two on less (BenchmarkReserveReply: 2.5 against
// 3.3 µs for two reservations, 5.0 against 16.0 for sixteen).
const packMin = 2

// packReplicas packs the replicas of entries (by their index) when they
// are at least packMin and all are memory replicas, and returns nil
// otherwise: the reply is then sent unpacked.
func packReplicas(entries int, replicas func(int) []master.Replica) *storepb.PackedReplicas {
	if entries < packMin {
		return nil
	}
	n := 0
	for e := range entries {
		for _, r := range replicas(e) {
			if r.Type != master.Memory {
				return nil
			}
			n++
		}
	}
	k := storepb.NewPacker(entries, n)
	for e := range entries {
		for _, r := range replicas(e) {
			k.Add(r.SegmentName, r.Protocol, r.SegmentID.Hi, r.SegmentID.Lo, r.Addr, r.Size, storepb.ReplicaStatus(r.Status))
		}
		k.End()
	}
	return k.Packed()
}

// batchReplicas prepares the replicas of a batch reply's entries: packed
// when asked for and possible, otherwise a replicaBuf for all of them.
func batchReplicas(packed bool, entries int, replicas func(int) []master.Replica) (*storepb.PackedReplicas, *replicaBuf) {
	if packed {
		if p := packReplicas(entries, replicas); p != nil {
			return p, nil
		}
	}
	n := 0
	for e := range entries {
		n += len(replicas(e))
	}
	return nil, newReplicaBuf(n)
}

func replicasPB(rs []master.Replica) []*storepb.ReplicaDescriptor {
	b := newReplicaBuf(len(rs))
	return b.add(rs)
}

// replicaBuf holds the messages of n replica descriptors, allocated
// together, so a reply allocates them at once: a single-key reply (the
// commonest) in one allocation, a batch reply in three.
type replicaBuf struct {
	ptrs  []*storepb.ReplicaDescriptor
	slots []replicaSlot
}

// replicaSlot is the three messages of one replica descriptor.
type replicaSlot struct {
	rep storepb.ReplicaDescriptor
	mem storepb.MemoryDescriptor
	id  storepb.UUID
}

// oneReplica is a replicaBuf for one descriptor with its storage.
type oneReplica struct {
	b    replicaBuf
	ptr  [1]*storepb.ReplicaDescriptor
	slot [1]replicaSlot
}

func newReplicaBuf(n int) *replicaBuf {
	if n == 1 {
		o := new(oneReplica)
		o.b.ptrs, o.b.slots = o.ptr[:0], o.slot[:]
		return &o.b
	}
	return &replicaBuf{ptrs: make([]*storepb.ReplicaDescriptor, 0, n), slots: make([]replicaSlot, n)}
}

// add describes rs with the next len(rs) slots (at most n in all).
func (b *replicaBuf) add(rs []master.Replica) []*storepb.ReplicaDescriptor {
	start := len(b.ptrs)
	for _, r := range rs {
		sl := &b.slots[len(b.ptrs)]
		id, mem, rep := &sl.id, &sl.mem, &sl.rep
		id.High, id.Low = r.SegmentID.Hi, r.SegmentID.Lo
		mem.SegmentName, mem.BufferAddress, mem.Size, mem.Protocol, mem.SegmentId = r.SegmentName, r.Addr, r.Size, r.Protocol, id
		rep.Type, rep.Status, rep.Memory = storepb.ReplicaType(r.Type), storepb.ReplicaStatus(r.Status), mem
		b.ptrs = append(b.ptrs, rep)
	}
	return slices.Clip(b.ptrs[start:])
}

func blockFromPB(b *storepb.BlockMetadata) *master.BlockMeta {
	if b == nil {
		return nil
	}
	bm := &master.BlockMeta{BlockHashes: b.BlockHashes, TokenIDs: b.TokenIds, BlockSize: b.BlockSize, LoraName: b.LoraName}
	if b.ParentBlockHash != nil {
		bm.HasParent, bm.ParentHash = true, *b.ParentBlockHash
	}
	if b.LoraId != nil {
		bm.HasLora, bm.LoraID = true, *b.LoraId
	}
	return bm
}

func segmentFromPB(s *storepb.Segment) (alloc.Segment, error) {
	if s == nil || s.Id == nil {
		return alloc.Segment{}, errcode.New(errcode.InvalidParams, "segment or its id missing")
	}
	return alloc.Segment{ID: fromPB(s.Id), Name: s.Name, Base: s.Base, Size: s.Size, Protocol: s.Protocol,
		TEEndpoint: s.TeEndpoint}, nil
}

func item(err error) *storepb.ItemResult {
	code, msg := outcome(err)
	return &storepb.ItemResult{ErrorCode: code, Message: msg}
}

// outcome is an item's code and message.
func outcome(err error) (int32, string) {
	if err == nil {
		return 0, ""
	}
	return int32(errcode.CodeOf(err)), err.Error()
}

// itemsPB answers per item: packed when asked for and there are at least
// packMin items, else one ItemResult each.
func itemsPB(packed bool, errs []error) ([]*storepb.ItemResult, *storepb.PackedResults) {
	if packed && len(errs) >= packMin {
		return nil, storepb.PackResults(len(errs), func(i int) (int32, string) { return outcome(errs[i]) }, nil)
	}
	return items(errs), nil
}

// items answers a batch per item.
func items(errs []error) []*storepb.ItemResult {
	out := make([]*storepb.ItemResult, len(errs))
	res := make([]storepb.ItemResult, len(errs)) // one allocation for the batch
	for i, e := range errs {
		r := &res[i]
		r.ErrorCode, r.Message = outcome(e)
		out[i] = r
	}
	return out
}

// PutStart implements storepb.MasterServer.
func (s *Service) PutStart(_ context.Context, r *storepb.PutStartRequest) (resp *storepb.PutStartResponse, err error) {
	c, err := clientID(r.ClientId)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	rc, err := configFromPB(r.Config)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	reps, gen, err := s.m.PutStartGen(c, r.Key, r.Size, rc)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.PutStartResponse{Replicas: replicasPB(reps), Generation: gen}, nil
}

// PutEnd implements storepb.MasterServer.
func (s *Service) PutEnd(_ context.Context, r *storepb.PutEndRequest) (_ *storepb.PutEndResponse, err error) {
	c, err := clientID(r.ClientId)
	if err == nil {
		err = s.m.PutEndGen(c, r.Key, r.Generation, master.ReplicaType(r.ReplicaType), blockFromPB(r.Block))
	}
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.PutEndResponse{}, nil
}

// PutRevoke implements storepb.MasterServer.
func (s *Service) PutRevoke(_ context.Context, r *storepb.PutRevokeRequest) (_ *storepb.PutRevokeResponse, err error) {
	c, err := clientID(r.ClientId)
	if err == nil {
		err = s.m.PutRevokeGen(c, r.Key, r.Generation, master.ReplicaType(r.ReplicaType))
	}
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.PutRevokeResponse{}, nil
}

// batchBufs are the batch handlers' result arrays, reused across calls.
var batchBufs = sync.Pool{New: func() any { return new(master.BatchBuffers) }}

// getBatchBufs hands out a batch's arrays; put them back with
// putBatchBufs once the reply holds copies (packed bytes or its own
// messages) of what they describe.
func getBatchBufs() *master.BatchBuffers { return batchBufs.Get().(*master.BatchBuffers) }

func putBatchBufs(b *master.BatchBuffers) {
	b.Reset()
	if b.Cap() <= maxPooledBatch {
		batchBufs.Put(b)
	}
}

// maxPooledBatch bounds the items (results or replicas) of the arrays
// kept in a pool: a rare huge batch does not pin its arrays.
const maxPooledBatch = 4096

// checkBatch refuses a batch of more than storepb.MaxBatchItems items,
// before anything is sized by its count.
func checkBatch(n int) error {
	if n > storepb.MaxBatchItems {
		return rpcerr.ToStatus(errcode.New(errcode.InvalidParams, "%d items in one batch > %d", n, storepb.MaxBatchItems))
	}
	return nil
}

// BatchPutStart implements storepb.MasterServer.
func (s *Service) BatchPutStart(_ context.Context, r *storepb.BatchPutStartRequest) (_ *storepb.BatchPutStartResponse, err error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	c, err := clientID(r.ClientId)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	rc, err := configFromPB(r.Config)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	bufs := getBatchBufs()
	defer putBatchBufs(bufs)
	res, err := s.m.BatchPutStartInto(c, r.Keys, r.Sizes, rc, bufs)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	out := &storepb.BatchPutStartResponse{}
	var b *replicaBuf
	out.Packed, b = batchReplicas(r.Packed, len(res), func(i int) []master.Replica { return res[i].Replicas })
	if out.Packed != nil {
		out.PackedResults = storepb.PackResults(len(res), func(i int) (int32, string) { return outcome(res[i].Err) },
			func(i int) uint64 { return res[i].Gen })
		return out, nil
	}
	// One allocation per message type for the whole batch, not one per
	// message per item.
	out.Results = make([]*storepb.PutStartResult, len(res))
	results := make([]storepb.PutStartResult, len(res))
	for i, x := range res {
		r := &results[i]
		out.Results[i] = r
		if x.Err != nil {
			r.ErrorCode, r.Message = outcome(x.Err)
			continue
		}
		r.Replicas, r.Generation = b.add(x.Replicas), x.Gen
	}
	return out, nil
}

// BatchPutEnd implements storepb.MasterServer.
func (s *Service) BatchPutEnd(_ context.Context, r *storepb.BatchPutEndRequest) (_ *storepb.BatchPutEndResponse, err error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	c, err := clientID(r.ClientId)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	var blocks []*master.BlockMeta
	if len(r.Blocks) > 0 {
		blocks = make([]*master.BlockMeta, len(r.Blocks))
		for i, b := range r.Blocks {
			blocks[i] = blockFromPB(b)
		}
	}
	errs, err := s.m.BatchPutEndGen(c, r.Keys, r.Generations, master.ReplicaType(r.ReplicaType), blocks)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	out := &storepb.BatchPutEndResponse{}
	out.Results, out.PackedResults = itemsPB(r.Packed, errs)
	return out, nil
}

// BatchPutRevoke implements storepb.MasterServer.
func (s *Service) BatchPutRevoke(_ context.Context, r *storepb.BatchPutRevokeRequest) (_ *storepb.BatchPutRevokeResponse, err error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	c, err := clientID(r.ClientId)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	errs, err := s.m.BatchPutRevokeGen(c, r.Keys, r.Generations, master.ReplicaType(r.ReplicaType))
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	out := &storepb.BatchPutRevokeResponse{Results: items(errs)}
	return out, nil
}

// maxReserveSpecs bounds the specs of one ReservePut or CommitPut.
const maxReserveSpecs = 64

// reserve serves specs after giving back release; nil specs answer nil.
func (s *Service) reserve(c master.UUID, release []uint64, specs []*storepb.ReserveSpec) ([]*storepb.ReserveResult, error) {
	if len(specs) > maxReserveSpecs {
		return nil, errcode.New(errcode.InvalidParams, "%d reserve specs > %d", len(specs), maxReserveSpecs)
	}
	if len(release) > 0 {
		s.m.Unreserve(c, release)
	}
	if len(specs) == 0 {
		return nil, nil
	}
	out := make([]*storepb.ReserveResult, len(specs))
	for i, sp := range specs {
		rc, err := configFromPB(sp.GetConfig())
		var res master.ReserveResult
		if err == nil {
			res = s.m.Reserve(c, master.ReserveSpec{Size: sp.GetSize(), Config: rc, Count: int(min(sp.GetCount(), master.MaxReserveCount+1))})
			err = res.Err
		}
		if err != nil {
			out[i] = &storepb.ReserveResult{ErrorCode: int32(errcode.CodeOf(err)), Message: err.Error()}
			continue
		}
		out[i] = reservationsPB(sp.Packed, res.Reservations)
	}
	return out, nil
}

// reservationsPB answers one reserve spec, packed when asked for and
// possible.
func reservationsPB(packed bool, rs []master.Reservation) *storepb.ReserveResult {
	// Packed reservations share one size.
	packed = packed && !slices.ContainsFunc(rs, func(x master.Reservation) bool { return x.Size != rs[0].Size })
	p, b := batchReplicas(packed, len(rs), func(i int) []master.Replica { return rs[i].Replicas })
	if p != nil {
		ids := make([]uint64, len(rs))
		for j, x := range rs {
			ids[j] = x.ID
		}
		return &storepb.ReserveResult{Packed: p, PackedIds: ids, PackedSize: rs[0].Size}
	}
	msgs := make([]storepb.Reservation, len(rs))
	out := make([]*storepb.Reservation, len(rs))
	for j, x := range rs {
		m := &msgs[j]
		m.Id, m.Size, m.Replicas = x.ID, x.Size, b.add(x.Replicas)
		out[j] = m
	}
	return &storepb.ReserveResult{Reservations: out}
}

func (s *Service) reserveTTL() uint64 { return leaseMs(s.m.Config().PutDiscardTimeout) }

// ReservePut implements storepb.MasterServer.
func (s *Service) ReservePut(_ context.Context, r *storepb.ReservePutRequest) (_ *storepb.ReservePutResponse, err error) {
	c, err := clientID(r.ClientId)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	res, err := s.reserve(c, r.Release, r.Specs)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.ReservePutResponse{Results: res, TtlMs: s.reserveTTL()}, nil
}

// CommitPut implements storepb.MasterServer.
func (s *Service) CommitPut(_ context.Context, r *storepb.CommitPutRequest) (_ *storepb.CommitPutResponse, err error) {
	if err := checkBatch(len(r.Items)); err != nil {
		return nil, err
	}
	c, err := clientID(r.ClientId)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	if len(r.Reserve) > maxReserveSpecs {
		return nil, rpcerr.ToStatus(errcode.New(errcode.InvalidParams, "%d reserve specs > %d", len(r.Reserve), maxReserveSpecs))
	}
	commits := make([]master.CommitItem, len(r.Items))
	for i, it := range r.Items {
		commits[i] = master.CommitItem{Key: it.GetKey(), ID: it.GetReservationId(), Block: blockFromPB(it.GetBlock())}
	}
	errs := s.m.Commit(c, commits)
	out := &storepb.CommitPutResponse{TtlMs: s.reserveTTL()}
	out.Results, out.PackedResults = itemsPB(r.Packed, errs)
	// Items are committed whatever happens to the reservations asked for.
	out.Reserved, _ = s.reserve(c, r.Release, r.Reserve)
	return out, nil
}

func leaseMs(d time.Duration) uint64 { return uint64(d / time.Millisecond) }

// GetReplicaList implements storepb.MasterServer.
func (s *Service) GetReplicaList(_ context.Context, r *storepb.GetReplicaListRequest) (_ *storepb.GetReplicaListResponse, err error) {
	reps, ttl, err := s.m.GetReplicaList(r.Key)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.GetReplicaListResponse{Replicas: replicasPB(reps), LeaseTtlMs: leaseMs(ttl)}, nil
}

// BatchGetReplicaList implements storepb.MasterServer.
func (s *Service) BatchGetReplicaList(_ context.Context, r *storepb.BatchGetReplicaListRequest) (_ *storepb.BatchGetReplicaListResponse, err error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	bufs := getBatchBufs()
	defer putBatchBufs(bufs)
	res := s.m.BatchGetReplicaListInto(r.Keys, bufs)
	out := &storepb.BatchGetReplicaListResponse{}
	var b *replicaBuf
	out.Packed, b = batchReplicas(r.Packed, len(res), func(i int) []master.Replica { return res[i].Replicas })
	if out.Packed != nil {
		out.PackedResults = storepb.PackResults(len(res), func(i int) (int32, string) { return outcome(res[i].Err) },
			func(i int) uint64 { return leaseMs(res[i].LeaseTTL) })
		return out, nil
	}
	out.Results = make([]*storepb.GetReplicaListResult, len(res))
	results := make([]storepb.GetReplicaListResult, len(res))
	for i, x := range res {
		m := &results[i]
		out.Results[i] = m
		if x.Err != nil {
			m.ErrorCode, m.Message = outcome(x.Err)
			continue
		}
		m.Replicas, m.LeaseTtlMs = b.add(x.Replicas), leaseMs(x.LeaseTTL)
	}
	return out, nil
}

// ExistKey implements storepb.MasterServer.
func (s *Service) ExistKey(_ context.Context, r *storepb.ExistKeyRequest) (_ *storepb.ExistKeyResponse, err error) {
	ok, err := s.m.ExistKey(r.Key, r.NoLease)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.ExistKeyResponse{Exists: ok}, nil
}

// BatchExistKey implements storepb.MasterServer.
func (s *Service) BatchExistKey(_ context.Context, r *storepb.BatchExistKeyRequest) (_ *storepb.BatchExistKeyResponse, err error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	ok, errs := s.m.BatchExistKey(r.Keys, r.NoLease)
	out := &storepb.BatchExistKeyResponse{Results: make([]*storepb.ExistResult, len(ok))}
	for i := range ok {
		out.Results[i] = &storepb.ExistResult{ErrorCode: int32(errcode.CodeOf(errs[i])), Exists: ok[i]}
	}
	return out, nil
}

// Remove implements storepb.MasterServer.
func (s *Service) Remove(_ context.Context, r *storepb.RemoveRequest) (_ *storepb.RemoveResponse, err error) {
	if err = s.m.Remove(r.Key, r.Force); err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.RemoveResponse{}, nil
}

// BatchRemove implements storepb.MasterServer.
func (s *Service) BatchRemove(_ context.Context, r *storepb.BatchRemoveRequest) (_ *storepb.BatchRemoveResponse, err error) {
	if err := checkBatch(len(r.Keys)); err != nil {
		return nil, err
	}
	errs := s.m.BatchRemove(r.Keys, r.Force)
	out := &storepb.BatchRemoveResponse{Results: items(errs)}
	return out, nil
}

// RemoveByRegex implements storepb.MasterServer.
func (s *Service) RemoveByRegex(_ context.Context, r *storepb.RemoveByRegexRequest) (_ *storepb.RemoveByRegexResponse, err error) {
	n, err := s.m.RemoveByRegex(r.Regex, r.Force)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.RemoveByRegexResponse{Removed: n}, nil
}

// RemoveAll implements storepb.MasterServer.
func (s *Service) RemoveAll(_ context.Context, r *storepb.RemoveAllRequest) (_ *storepb.RemoveAllResponse, err error) {
	n, err := s.m.RemoveAll(r.Force)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.RemoveAllResponse{Removed: n}, nil
}

// MountSegment implements storepb.MasterServer.
func (s *Service) MountSegment(_ context.Context, r *storepb.MountSegmentRequest) (_ *storepb.MountSegmentResponse, err error) {
	c, err := clientID(r.ClientId)
	var seg alloc.Segment
	if err == nil {
		seg, err = segmentFromPB(r.Segment)
	}
	if err == nil {
		err = s.m.MountSegment(c, seg)
	}
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.MountSegmentResponse{}, nil
}

// ReMountSegment implements storepb.MasterServer.
func (s *Service) ReMountSegment(_ context.Context, r *storepb.ReMountSegmentRequest) (_ *storepb.ReMountSegmentResponse, err error) {
	c, err := clientID(r.ClientId)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	segs := make([]alloc.Segment, len(r.Segments))
	for i, ps := range r.Segments {
		if segs[i], err = segmentFromPB(ps); err != nil {
			return nil, rpcerr.ToStatus(err)
		}
	}
	if err = s.m.ReMountSegment(c, segs); err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.ReMountSegmentResponse{}, nil
}

// UnmountSegment implements storepb.MasterServer.
func (s *Service) UnmountSegment(_ context.Context, r *storepb.UnmountSegmentRequest) (_ *storepb.UnmountSegmentResponse, err error) {
	c, err := clientID(r.ClientId)
	if err == nil && r.SegmentId == nil {
		err = errcode.New(errcode.InvalidParams, "segment_id missing")
	}
	if err == nil {
		err = s.m.UnmountSegment(c, fromPB(r.SegmentId))
	}
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.UnmountSegmentResponse{}, nil
}

// QuerySegmentStatus implements storepb.MasterServer.
func (s *Service) QuerySegmentStatus(_ context.Context, r *storepb.QuerySegmentStatusRequest) (_ *storepb.QuerySegmentStatusResponse, err error) {
	if r.SegmentId == nil {
		err = errcode.New(errcode.InvalidParams, "segment_id missing")
		return nil, rpcerr.ToStatus(err)
	}
	info, err := s.m.QuerySegmentStatus(fromPB(r.SegmentId))
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.QuerySegmentStatusResponse{Status: storepb.SegmentStatus(info.Status), Capacity: info.Capacity,
		Used: info.Used, Name: info.Name}, nil
}

// Ping implements storepb.MasterServer.
func (s *Service) Ping(_ context.Context, r *storepb.PingRequest) (_ *storepb.PingResponse, err error) {
	c, err := clientID(r.ClientId)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	view, st := s.m.Ping(c)
	return &storepb.PingResponse{ViewVersion: view, ClientStatus: storepb.ClientStatus(st)}, nil
}

// ServiceReady implements storepb.MasterServer: a serving master is ready.
func (s *Service) ServiceReady(context.Context, *storepb.ServiceReadyRequest) (_ *storepb.ServiceReadyResponse, err error) {
	return &storepb.ServiceReadyResponse{}, nil
}

// ReportFailedSegments implements storepb.MasterServer.
func (s *Service) ReportFailedSegments(_ context.Context, r *storepb.ReportFailedSegmentsRequest) (_ *storepb.ReportFailedSegmentsResponse, err error) {
	c, err := clientID(r.ClientId)
	if err == nil && len(r.SegmentIds) > master.MaxReportSegments {
		err = errcode.New(errcode.InvalidParams, "%d segments reported > %d", len(r.SegmentIds), master.MaxReportSegments)
	}
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	ids := make([]master.UUID, len(r.SegmentIds))
	for i, id := range r.SegmentIds {
		ids[i] = fromPB(id)
	}
	n, err := s.m.ReportFailedSegments(c, ids)
	if err != nil {
		return nil, rpcerr.ToStatus(err)
	}
	return &storepb.ReportFailedSegmentsResponse{Marked: uint32(n)}, nil
}
