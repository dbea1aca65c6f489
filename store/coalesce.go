package store

import (
	"context"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/crescent-kv/crescent/store/errcode"
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
type coalescer[Q, R any] struct {
	max int
	// send runs one RPC for qs and returns one result and one error per
	// item (a failed RPC fails every item).
	send func(ctx context.Context, qs []Q) ([]R, []error)
	// same reports whether two calls can share a batch RPC.
	same func(a, b Q) bool

	mu   sync.Mutex
	busy bool
	q    []*pending[Q, R]
}

type pending[Q, R any] struct {
	q    Q
	r    R
	err  error
	done chan struct{}
	lead bool // woken to run a batch, not with a result
}

func newCoalescer[Q, R any](max int, same func(a, b Q) bool, send func(context.Context, []Q) ([]R, []error)) *coalescer[Q, R] {
	return &coalescer[Q, R]{max: max, same: same, send: send}
}

// do runs q, alone or in a batch. A queued call does not give up when ctx
// ends: its request may already be on the wire, and the batch is bounded
// by the RPC timeout.
func (c *coalescer[Q, R]) do(ctx context.Context, q Q) (R, error) {
	p := &pending[Q, R]{q: q}
	c.mu.Lock()
	if c.busy {
		p.done = make(chan struct{})
		c.q = append(c.q, p)
		c.mu.Unlock()
		<-p.done
		if !p.lead {
			return p.r, p.err
		}
	} else {
		c.busy = true
		c.mu.Unlock()
	}
	c.run(ctx, p)
	return p.r, p.err
}

// run sends the batch headed by p, then hands leadership to the oldest
// queued call, if any.
func (c *coalescer[Q, R]) run(ctx context.Context, p *pending[Q, R]) {
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
	// Others' calls ride on this RPC: the leader's cancellation must not
	// fail them.
	rs, errs := c.send(context.WithoutCancel(ctx), qs)
	for i, x := range batch {
		x.r, x.err = rs[i], errs[i]
		if x != p {
			close(x.done)
		}
	}

	c.mu.Lock()
	if len(c.q) == 0 {
		c.busy = false
		c.mu.Unlock()
		return
	}
	next := c.q[0]
	c.q = c.q[1:]
	next.lead = true
	c.mu.Unlock()
	close(next.done)
}

// maxCoalesce bounds one coalesced batch RPC.
const maxCoalesce = 128

type putStartQ struct {
	key  string
	size uint64
	rc   *storepb.ReplicateConfig
}

type putEndQ struct {
	key   string
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
	mem := storepb.ReplicaType_REPLICA_TYPE_MEMORY
	c.putStarts = newCoalescer(maxCoalesce,
		func(a, b putStartQ) bool { return proto.Equal(a.rc, b.rc) },
		func(ctx context.Context, qs []putStartQ) ([][]*storepb.ReplicaDescriptor, []error) {
			rs, errs := make([][]*storepb.ReplicaDescriptor, len(qs)), make([]error, len(qs))
			rctx, cancel := c.rpcCtx(ctx)
			defer cancel()
			if len(qs) == 1 {
				resp, err := c.master.PutStart(rctx, &storepb.PutStartRequest{ClientId: c.id.pb(), Key: qs[0].key, Size: qs[0].size, Config: qs[0].rc})
				if err != nil {
					errs[0] = errcode.FromStatus(err)
				} else {
					rs[0] = resp.Replicas
				}
				return rs, errs
			}
			req := &storepb.BatchPutStartRequest{ClientId: c.id.pb(), Config: qs[0].rc}
			for _, q := range qs {
				req.Keys, req.Sizes = append(req.Keys, q.key), append(req.Sizes, q.size)
			}
			resp, err := c.master.BatchPutStart(rctx, req)
			if err == nil && len(resp.Results) != len(qs) {
				err = errcode.New(errcode.InternalError, "BatchPutStart answered %d results for %d keys", len(resp.Results), len(qs))
			} else if err != nil {
				err = errcode.FromStatus(err)
			}
			for i := range qs {
				if err != nil {
					errs[i] = err
					continue
				}
				r := resp.Results[i]
				if errs[i] = errcode.FromCode(errcode.Code(r.ErrorCode), r.Message); errs[i] == nil {
					rs[i] = r.Replicas
				}
			}
			return rs, errs
		})
	c.putEnds = newCoalescer(maxCoalesce,
		func(a, b putEndQ) bool { return (a.block == nil) == (b.block == nil) },
		func(ctx context.Context, qs []putEndQ) ([]struct{}, []error) {
			errs := make([]error, len(qs))
			rctx, cancel := c.rpcCtx(ctx)
			defer cancel()
			if len(qs) == 1 {
				if _, err := c.master.PutEnd(rctx, &storepb.PutEndRequest{ClientId: c.id.pb(), Key: qs[0].key, ReplicaType: mem, Block: qs[0].block}); err != nil {
					errs[0] = errcode.FromStatus(err)
				}
				return make([]struct{}, 1), errs
			}
			req := &storepb.BatchPutEndRequest{ClientId: c.id.pb(), ReplicaType: mem}
			for _, q := range qs {
				req.Keys = append(req.Keys, q.key)
				if q.block != nil {
					req.Blocks = append(req.Blocks, q.block)
				}
			}
			resp, err := c.master.BatchPutEnd(rctx, req)
			if err == nil && len(resp.Results) != len(qs) {
				err = errcode.New(errcode.InternalError, "BatchPutEnd answered %d results for %d keys", len(resp.Results), len(qs))
			} else if err != nil {
				err = errcode.FromStatus(err)
			}
			for i := range qs {
				if err != nil {
					errs[i] = err
				} else {
					errs[i] = errcode.FromCode(errcode.Code(resp.Results[i].ErrorCode), resp.Results[i].Message)
				}
			}
			return make([]struct{}, len(qs)), errs
		})
	c.gets = newCoalescer(maxCoalesce,
		func(a, b string) bool { return true },
		func(ctx context.Context, keys []string) ([]getResult, []error) {
			rs, errs := make([]getResult, len(keys)), make([]error, len(keys))
			rctx, cancel := c.rpcCtx(ctx)
			defer cancel()
			if len(keys) == 1 {
				resp, err := c.master.GetReplicaList(rctx, &storepb.GetReplicaListRequest{Key: keys[0]})
				if err != nil {
					errs[0] = errcode.FromStatus(err)
				} else {
					rs[0] = getResult{resp.Replicas, time.Duration(resp.LeaseTtlMs) * time.Millisecond}
				}
				return rs, errs
			}
			resp, err := c.master.BatchGetReplicaList(rctx, &storepb.BatchGetReplicaListRequest{Keys: keys})
			if err == nil && len(resp.Results) != len(keys) {
				err = errcode.New(errcode.InternalError, "BatchGetReplicaList answered %d results for %d keys", len(resp.Results), len(keys))
			} else if err != nil {
				err = errcode.FromStatus(err)
			}
			for i := range keys {
				if err != nil {
					errs[i] = err
					continue
				}
				r := resp.Results[i]
				if errs[i] = errcode.FromCode(errcode.Code(r.ErrorCode), r.Message); errs[i] == nil {
					rs[i] = getResult{r.Replicas, time.Duration(r.LeaseTtlMs) * time.Millisecond}
				}
			}
			return rs, errs
		})
}
