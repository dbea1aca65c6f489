package store

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// coalescer merges concurrent single-key master calls into batch RPCs
// (group commit). A call on an idle coalescer leaves at once, alone, on the
// single-key RPC, so an unloaded client pays nothing; calls that arrive
// while one is in flight queue, and the next leader takes every
// compatible queued call (up to max) into one batch RPC. Under load this
// divides the RPC cost of Put and Get by the batch size.
//
// Leadership passes from caller to caller: the goroutine that runs a batch
// is always one whose own call is in it, so no goroutine works for others
// after its call is done.
//
// Up to depth batches are in flight at once. With one, a call that
// arrives while a batch is out waits for its answer and then for its own
// batch's, which on a durable master (each answer waits for an fsync)
// costs two durability waits, and the master never sees more than one of
// a client's batches per group commit; a second batch in flight lets
// the calls queued meanwhile join the master's next commit.
type coalescer[Q, R any] struct {
	max   int
	depth int
	// send runs one RPC for qs and returns one result and one error per
	// item (a failed RPC fails every item).
	send func(ctx context.Context, qs []Q) ([]R, []error)
	// same reports whether two calls can share a batch RPC.
	same func(a, b Q) bool

	mu   sync.Mutex
	busy int // batches in flight
	q    []*pending[Q, R]
}

type pending[Q, R any] struct {
	ctx  context.Context
	q    Q
	r    R
	err  error
	done chan struct{}
	lead bool // woken to run a batch, not with a result
}

func newCoalescer[Q, R any](max int, same func(a, b Q) bool, send func(context.Context, []Q) ([]R, []error)) *coalescer[Q, R] {
	return &coalescer[Q, R]{max: max, depth: coalesceDepth, same: same, send: send}
}

// do runs q, alone or in a batch. A queued call does not give up when ctx
// ends: its request may already be on the wire. The batch's RPC ends when
// every call in it has ended (batchCtx), and is bounded by the RPC timeout.
func (c *coalescer[Q, R]) do(ctx context.Context, q Q) (R, error) {
	p := &pending[Q, R]{ctx: ctx, q: q}
	c.mu.Lock()
	if c.busy >= c.depth {
		p.done = make(chan struct{})
		c.q = append(c.q, p)
		c.mu.Unlock()
		<-p.done
		if !p.lead {
			return p.r, p.err
		}
	} else {
		c.busy++
		c.mu.Unlock()
	}
	c.run(p)
	return p.r, p.err
}

// run sends the batch headed by p, then hands leadership to the oldest
// queued call, if any.
func (c *coalescer[Q, R]) run(p *pending[Q, R]) {
	batch := []*pending[Q, R]{p}
	c.mu.Lock()
	keep := c.q[:0]
	for _, x := range c.q {
		if len(batch) < c.max && c.same(p.q, x.q) {
			batch = append(batch, x)
		} else {
			keep = append(keep, x)
		}
	}
	clear(c.q[len(keep):])
	c.q = keep
	c.mu.Unlock()

	qs := make([]Q, len(batch))
	for i, x := range batch {
		qs[i] = x.q
	}
	bctx, done := batchCtx(batch)
	rs, errs := c.send(bctx, qs)
	done()
	for i, x := range batch {
		x.r, x.err = rs[i], errs[i]
		if x != p {
			close(x.done)
		}
	}

	c.mu.Lock()
	if len(c.q) == 0 {
		c.busy--
		c.mu.Unlock()
		return
	}
	next := c.q[0]
	c.q = c.q[1:]
	next.lead = true
	c.mu.Unlock()
	close(next.done)
}

// batchCtx is the context of a batch's RPC. Others' calls ride on it, so
// one call's end must not fail them, but once every call has ended
// nobody waits for the answer: a caller whose context ends while no
// master leads gets its error then, not at the RPC timeout. A lone call
// uses its own context.
func batchCtx[Q, R any](batch []*pending[Q, R]) (context.Context, func()) {
	if len(batch) == 1 {
		return batch[0].ctx, noop
	}
	for _, x := range batch {
		if x.ctx.Done() == nil { // a call that never ends keeps the RPC
			return context.WithoutCancel(batch[0].ctx), noop
		}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	var live atomic.Int32
	live.Store(int32(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, x := range batch {
		stops[i] = context.AfterFunc(x.ctx, func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// noop is a package-level func: a literal in a generic function is
// allocated on each call.
var noop = func() {}

// maxCoalesce bounds one coalesced batch RPC; coalesceDepth is how many
// of a coalescer's batches may be in flight at once.
const (
	maxCoalesce   = 128
	coalesceDepth = 2
)

type putStartQ struct {
	key  string
	size uint64
	rc   *storepb.ReplicateConfig
}

// putStarted is one PutStart's answer: where to write, and the put's
// generation, sent back with PutEnd/PutRevoke.
type putStarted struct {
	replicas []*storepb.ReplicaDescriptor
	gen      uint64
}

type putEndQ struct {
	key   string
	gen   uint64
	block *storepb.BlockMetadata
}

// getResult is one key's GetReplicaList answer.
type getResult struct {
	replicas []*storepb.ReplicaDescriptor
	leaseTTL time.Duration
}

// startCoalescers wires the single-key Put and Get RPCs through
// coalescers.
func (c *Client) startCoalescers() {
	c.putStarts = newCoalescer(maxCoalesce,
		func(a, b putStartQ) bool { return proto.Equal(a.rc, b.rc) },
		func(ctx context.Context, qs []putStartQ) ([]putStarted, []error) {
			keys, sizes := make([]string, len(qs)), make([]uint64, len(qs))
			for i, q := range qs {
				keys[i], sizes[i] = q.key, q.size
			}
			return c.rpcPutStart(ctx, keys, sizes, qs[0].rc)
		})
	c.putEnds = newCoalescer(maxCoalesce,
		func(a, b putEndQ) bool { return (a.block == nil) == (b.block == nil) },
		func(ctx context.Context, qs []putEndQ) ([]struct{}, []error) {
			keys, gens := make([]string, len(qs)), make([]uint64, len(qs))
			var blocks []*storepb.BlockMetadata
			for i, q := range qs {
				keys[i], gens[i] = q.key, q.gen
				if q.block != nil {
					blocks = append(blocks, q.block)
				}
			}
			return make([]struct{}, len(qs)), c.rpcPutEnd(ctx, keys, gens, blocks)
		})
	c.gets = newCoalescer(maxCoalesce,
		func(a, b string) bool { return true },
		c.rpcGetReplicaList)
	c.commits = newCoalescer(maxCoalesce,
		func(a, b commitQ) bool { return true },
		c.rpcCommit)
}

// The three RPC helpers below answer per key, whatever was sent: the
// single-key RPC for one key, the batch RPC for more. A failed RPC fails
// every key.

// rpcPutStart reserves space for keys (all with config rc).
func (c *Client) rpcPutStart(ctx context.Context, keys []string, sizes []uint64, rc *storepb.ReplicateConfig) ([]putStarted, []error) {
	if len(keys) > storepb.MaxBatchItems {
		return inPieces(len(keys), func(lo, hi int) ([]putStarted, []error) { return c.rpcPutStart(ctx, keys[lo:hi], sizes[lo:hi], rc) })
	}
	rs, errs := make([]putStarted, len(keys)), make([]error, len(keys))
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	if len(keys) == 1 {
		resp, err := c.master.PutStart(rctx, &storepb.PutStartRequest{ClientId: c.id.pb(), Session: c.session, Key: keys[0], Size: sizes[0], Config: rc})
		if err != nil {
			errs[0] = rpcerr.FromStatus(err)
		} else {
			rs[0] = putStarted{resp.Replicas, resp.Generation}
		}
		return rs, errs
	}
	resp, err := c.master.BatchPutStart(rctx, &storepb.BatchPutStartRequest{ClientId: c.id.pb(), Session: c.session, Keys: keys, Sizes: sizes, Config: rc, Packed: true})
	ierrs, gens, reps, err := replicaReplies("BatchPutStart", err, len(keys), resp.GetPackedResults(), resp.GetPacked(), len(resp.GetResults()),
		func(i int) (int32, string, uint64, []*storepb.ReplicaDescriptor) {
			r := resp.Results[i]
			return r.ErrorCode, r.Message, r.Generation, r.Replicas
		})
	if err != nil {
		fill(errs, err)
		return rs, errs
	}
	for i := range keys {
		if errs[i] = ierrs[i]; errs[i] == nil {
			rs[i] = putStarted{reps[i], gens[i]}
		}
	}
	return rs, errs
}

// rpcPutEnd commits keys, the puts numbered gens; blocks is empty or one
// per key.
func (c *Client) rpcPutEnd(ctx context.Context, keys []string, gens []uint64, blocks []*storepb.BlockMetadata) []error {
	if len(keys) > storepb.MaxBatchItems {
		_, errs := inPieces(len(keys), func(lo, hi int) ([]struct{}, []error) {
			var bs []*storepb.BlockMetadata
			if len(blocks) > 0 {
				bs = blocks[lo:hi]
			}
			return make([]struct{}, hi-lo), c.rpcPutEnd(ctx, keys[lo:hi], gens[lo:hi], bs)
		})
		return errs
	}
	mem := storepb.ReplicaType_REPLICA_TYPE_MEMORY
	errs := make([]error, len(keys))
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	if len(keys) == 1 {
		var block *storepb.BlockMetadata
		if len(blocks) == 1 {
			block = blocks[0]
		}
		if _, err := c.master.PutEnd(rctx, &storepb.PutEndRequest{ClientId: c.id.pb(), Session: c.session, Key: keys[0], ReplicaType: mem, Block: block, Generation: gens[0]}); err != nil {
			errs[0] = rpcerr.FromStatus(err)
		}
		return errs
	}
	resp, err := c.master.BatchPutEnd(rctx, &storepb.BatchPutEndRequest{ClientId: c.id.pb(), Session: c.session, Keys: keys, ReplicaType: mem, Blocks: blocks, Generations: gens, Packed: true})
	ierrs, _, err := batchOutcomes("BatchPutEnd", err, len(keys), resp.GetPackedResults(), len(resp.GetResults()), false,
		func(i int) (int32, string, uint64) { r := resp.Results[i]; return r.ErrorCode, r.Message, 0 })
	if err != nil {
		fill(errs, err)
		return errs
	}
	return ierrs
}

// rpcGetReplicaList locates keys, granting read leases.
func (c *Client) rpcGetReplicaList(ctx context.Context, keys []string) ([]getResult, []error) {
	if len(keys) > storepb.MaxBatchItems {
		return inPieces(len(keys), func(lo, hi int) ([]getResult, []error) { return c.rpcGetReplicaList(ctx, keys[lo:hi]) })
	}
	rs, errs := make([]getResult, len(keys)), make([]error, len(keys))
	rctx, cancel := c.rpcCtx(ctx)
	defer cancel()
	if len(keys) == 1 {
		resp, err := c.master.GetReplicaList(rctx, &storepb.GetReplicaListRequest{Key: keys[0]})
		if err != nil {
			errs[0] = rpcerr.FromStatus(err)
		} else {
			rs[0] = getResult{resp.Replicas, time.Duration(resp.LeaseTtlMs) * time.Millisecond}
		}
		return rs, errs
	}
	resp, err := c.master.BatchGetReplicaList(rctx, &storepb.BatchGetReplicaListRequest{Keys: keys, Packed: true})
	ierrs, ttls, reps, err := replicaReplies("BatchGetReplicaList", err, len(keys), resp.GetPackedResults(), resp.GetPacked(), len(resp.GetResults()),
		func(i int) (int32, string, uint64, []*storepb.ReplicaDescriptor) {
			r := resp.Results[i]
			return r.ErrorCode, r.Message, r.LeaseTtlMs, r.Replicas
		})
	if err != nil {
		fill(errs, err)
		return rs, errs
	}
	for i := range keys {
		if errs[i] = ierrs[i]; errs[i] == nil {
			rs[i] = getResult{reps[i], time.Duration(ttls[i]) * time.Millisecond}
		}
	}
	return rs, errs
}

// replicaReplies reads a batch reply that locates n keys (err is the
// RPC's own): per key its error, its number and its replicas, from the
// packed columns when it has them (a master that predates them, or a
// replica not in memory, sends got results instead, of which plain gives
// item i's).
func replicaReplies(rpc string, err error, n int, results *storepb.PackedResults, packed *storepb.PackedReplicas, got int,
	plain func(i int) (int32, string, uint64, []*storepb.ReplicaDescriptor)) ([]error, []uint64, [][]*storepb.ReplicaDescriptor, error) {
	errs, vals, err := batchOutcomes(rpc, err, n, results, got, true, func(i int) (int32, string, uint64) {
		code, msg, v, _ := plain(i)
		return code, msg, v
	})
	if err != nil {
		return nil, nil, nil, err
	}
	if packed == nil {
		if got != n {
			return nil, nil, nil, errcode.New(errcode.InternalError, "%s answered replicas for %d of %d keys", rpc, got, n)
		}
		reps := make([][]*storepb.ReplicaDescriptor, n)
		for i := range n {
			_, _, _, reps[i] = plain(i)
		}
		return errs, vals, reps, nil
	}
	reps, err := packed.Unpack(n)
	if err != nil {
		return nil, nil, nil, errcode.New(errcode.InternalError, "%s: %v", rpc, err)
	}
	return errs, vals, reps, nil
}

// batchOutcomes reads the per-item outcomes of a batch reply for n items
// (err is the RPC's own): its packed results when it has them, else its
// got results, of which plain gives item i's code, message and number.
// The numbers come back when values (the RPC has one per item).
func batchOutcomes(rpc string, err error, n int, packed *storepb.PackedResults, got int, values bool,
	plain func(i int) (int32, string, uint64)) ([]error, []uint64, error) {
	if err != nil {
		return nil, nil, rpcerr.FromStatus(err)
	}
	errs := make([]error, n)
	if packed != nil {
		o, err := packed.Unpack(n, values)
		if err != nil {
			return nil, nil, errcode.New(errcode.InternalError, "%s: %v", rpc, err)
		}
		for i, code := range o.Codes {
			errs[i] = errcode.FromCode(errcode.Code(code), o.Message(i))
		}
		return errs, o.Values, nil
	}
	if got != n {
		return nil, nil, errcode.New(errcode.InternalError, "%s answered %d results for %d keys", rpc, got, n)
	}
	var vals []uint64
	if values {
		vals = make([]uint64, n)
	}
	for i := range n {
		code, msg, v := plain(i)
		errs[i] = errcode.FromCode(errcode.Code(code), msg)
		if values {
			vals[i] = v
		}
	}
	return errs, vals, nil
}
