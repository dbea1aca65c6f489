package store

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/store/errcode"
	"github.com/crescent-kv/crescent/store/rpcerr"
	"github.com/crescent-kv/crescent/store/storepb"
)

// checkKey refuses keys the master would refuse, before any RPC.
func (c *Client) checkKey(key string) error {
	if key == "" {
		return errcode.New(errcode.InvalidKey, "empty key")
	}
	if c.cfg.MaxKeyLen > 0 && len(key) > c.cfg.MaxKeyLen {
		return errcode.New(errcode.InvalidKey, "key of %d bytes > %d", len(key), c.cfg.MaxKeyLen)
	}
	return nil
}

func checkValue(v []byte) error {
	if len(v) == 0 {
		return errcode.New(errcode.InvalidParams, "empty value")
	}
	return nil
}

// Put stores value under key. It fails with OBJECT_ALREADY_EXISTS when the
// key is stored or being stored; on any failure nothing is stored.
func (c *Client) Put(ctx context.Context, key string, value []byte, rc ReplicateConfig) error {
	return c.put(ctx, key, value, rc)
}

// PutFrom is Put from caller-owned memory: when src lies in registered
// memory (RegisterBuffer) the replicas are written straight from it, with
// no copy; otherwise through staging buffers.
func (c *Client) PutFrom(ctx context.Context, key string, src []byte, rc ReplicateConfig) error {
	return c.put(ctx, key, src, rc)
}

func (c *Client) put(ctx context.Context, key string, value []byte, rc ReplicateConfig) (err error) {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	start := time.Now()
	defer func() {
		c.stats.putLat.observe(time.Since(start))
		countOps(&c.stats.puts, &c.stats.putFail, 1, btoi(err != nil))
	}()
	if err := c.checkKey(key); err != nil {
		return err
	}
	if err := checkValue(value); err != nil {
		return err
	}
	if err := rc.check(); err != nil {
		return err
	}
	rcpb := rc.pb()
	attempt := 0
	if c.ahead != nil {
		done, fault, err := c.putAhead(ctx, key, value, rc, rcpb)
		if done {
			return err
		}
		if fault.any {
			// The reservation's write failed: place the put anew.
			if !c.retryAfter(ctx, fault, 0) {
				return err
			}
			attempt = 1
		}
	}
	return c.putTwoRPC(ctx, key, value, rcpb, rc.Block.pb(), attempt)
}

// putTwoRPC is a put in two round trips: PutStart, the writes, PutEnd
// (PutRevoke on failure). A put whose write to a segment failed is placed
// again (retryAfter); attempt counts the tries made before.
func (c *Client) putTwoRPC(ctx context.Context, key string, value []byte, rcpb *storepb.ReplicateConfig, block *storepb.BlockMetadata, attempt int) error {
	for ; ; attempt++ {
		fault, err := c.putOnce(ctx, key, value, rcpb, block)
		if !fault.any || !c.retryAfter(ctx, fault, attempt) {
			return err
		}
	}
}

func (c *Client) putOnce(ctx context.Context, key string, value []byte, rcpb *storepb.ReplicateConfig, block *storepb.BlockMetadata) (segFault, error) {
	st, err := c.putStarts.do(ctx, putStartQ{key: key, size: uint64(len(value)), rc: rcpb})
	if err != nil && errors.Is(err, errcode.ErrNoAvailableHandle) && c.ahead != nil && c.ahead.held() > 0 {
		// Our own reservations may be what fills the pool.
		c.ahead.age(true)
		c.giveBack(ctx)
		st, err = c.putStarts.do(ctx, putStartQ{key: key, size: uint64(len(value)), rc: rcpb})
	}
	if err != nil {
		return segFault{}, err
	}
	if c.beforeWrite != nil {
		c.beforeWrite()
	}
	xs, err := writeXfers(key, value, st.replicas, 0)
	if err == nil {
		c.transfer(ctx, xs)
		err = firstErr(xs)
	}
	if err == nil {
		if _, err = c.putEnds.do(ctx, putEndQ{key: key, gen: st.gen, block: block}); err == nil {
			c.stats.stored(len(st.replicas), rcpb.ReplicaNum)
			return segFault{}, nil
		}
	}
	c.revoke(ctx, []string{key}, []uint64{st.gen})
	return faultOf(xs), err
}

// putAhead runs a put in one round trip when a reservation of its class
// is at hand (ahead.go). done is false when the put must take the
// two-RPC path: no reservation, one the master no longer has, or one
// whose write failed at a segment (fault).
func (c *Client) putAhead(ctx context.Context, key string, value []byte, rc ReplicateConfig, rcpb *storepb.ReplicateConfig) (done bool, fault segFault, err error) {
	k, h, ok := c.takeAhead(uint64(len(value)), rcpb)
	if !ok {
		return false, segFault{}, nil
	}
	if c.beforeWrite != nil {
		c.beforeWrite()
	}
	xs, err := writeXfers(key, value, h.reps, 0)
	if err == nil {
		c.transfer(ctx, xs)
		err = firstErr(xs)
	}
	if err != nil {
		c.ahead.drop(h)
		fault = faultOf(xs)
		return !fault.any, fault, err
	}
	_, err = c.commits.do(ctx, commitQ{key: key, id: h.id, epoch: h.epoch, block: rc.Block.pb(), class: k, rc: rcpb})
	gone, err := c.settleAhead(k, h, err)
	if err == nil && !gone {
		c.stats.stored(len(h.reps), rcpb.ReplicaNum)
	}
	return !gone, segFault{}, err
}

// segFault says whether writes failed because of their segments, and
// which segments (those the master named).
type segFault struct {
	any bool
	ids []*storepb.UUID
}

// faultOf collects the segment faults of xs.
func faultOf(xs []*xfer) segFault {
	var f segFault
	for _, x := range xs {
		if !x.segFault {
			continue
		}
		f.any = true
		if x.segID != nil && !slices.ContainsFunc(f.ids, func(u *storepb.UUID) bool { return u.High == x.segID.High && u.Low == x.segID.Low }) {
			f.ids = append(f.ids, x.segID)
		}
	}
	return f
}

// maxReportSegments is the master's bound on one report.
const maxReportSegments = 64

// retryAfter handles puts whose writes failed at segments: it reports the
// segments to the master, which stops placing replicas there until their
// clients ping again, and drops the reservations held on them. It
// reports whether the puts may be placed again: attempt (counted from 0)
// was not the last of Config.PutRetries and ctx has not ended.
func (c *Client) retryAfter(ctx context.Context, f segFault, attempt int) bool {
	if ids := f.ids[:min(len(f.ids), maxReportSegments)]; len(ids) > 0 {
		if c.ahead != nil {
			c.ahead.dropOn(ids)
		}
		rctx, cancel := c.rpcCtx(ctx)
		_, err := c.master.ReportFailedSegments(rctx, &storepb.ReportFailedSegmentsRequest{ClientId: c.id.pb(), Session: c.session, SegmentIds: ids})
		cancel()
		if err != nil {
			c.log.Debug("reporting segments that failed writes", "segments", len(ids), "err", rpcerr.FromStatus(err))
		} else {
			c.stats.segReports.Add(uint64(len(ids)))
		}
	}
	if attempt >= c.cfg.PutRetries || ctx.Err() != nil {
		return false
	}
	c.stats.putRetries.Add(1)
	return true
}

// settleAhead files the outcome of committing reservation h of class k:
// the put's error, or gone when the master no longer had the reservation
// (the put must take the two-RPC path).
func (c *Client) settleAhead(k resvClass, h heldResv, err error) (gone bool, _ error) {
	switch {
	case err == nil:
		c.stats.putsAhead.Add(1)
		return false, nil
	case errors.Is(err, errcode.ErrObjectAlreadyExists):
		c.ahead.putBack(k, h) // nothing was committed: still ours
		return false, err
	case errors.Is(err, errcode.ErrReplicaIsGone):
		c.stats.aheadGone.Add(1)
		return true, nil
	}
	// Unknown outcome (the RPC failed): never use this reservation again.
	c.ahead.drop(h)
	return false, err
}

// writeXfers turns the replicas PutStart reserved into writes of value.
func writeXfers(key string, value []byte, reps []*storepb.ReplicaDescriptor, item int) ([]*xfer, error) {
	return appendWriteXfers(nil, nil, key, value, reps, item)
}

// appendWriteXfers is writeXfers appending to xs, the xfers taken from
// slab while it has room (a batch sizes one for all its items); xs is
// unchanged on error.
func appendWriteXfers(xs []*xfer, slab *[]xfer, key string, value []byte, reps []*storepb.ReplicaDescriptor, item int) ([]*xfer, error) {
	if len(reps) == 0 {
		return xs, errcode.New(errcode.InvalidReplica, "%q: master reserved no replica", key)
	}
	for _, r := range reps {
		m := r.GetMemory()
		if r.Type != storepb.ReplicaType_REPLICA_TYPE_MEMORY || m == nil {
			return xs, errcode.New(errcode.InvalidReplica, "%q: replica of type %s", key, r.Type)
		}
		if m.Size < uint64(len(value)) {
			return xs, errcode.New(errcode.InvalidReplica, "%q: replica of %d bytes for a %d-byte value", key, m.Size, len(value))
		}
	}
	for _, r := range reps {
		m := r.Memory
		var x *xfer
		if slab != nil && len(*slab) < cap(*slab) {
			*slab = (*slab)[:len(*slab)+1]
			x = &(*slab)[len(*slab)-1]
		} else {
			x = new(xfer)
		}
		*x = xfer{op: engine.Write, buf: value, seg: m.SegmentName, addr: m.BufferAddress, item: item, segID: m.SegmentId}
		xs = append(xs, x)
	}
	return xs, nil
}

func firstErr(xs []*xfer) error {
	for _, x := range xs {
		if x.err != nil {
			return x.err
		}
	}
	return nil
}

// revoke gives back the space of unfinished puts (numbered gens). It runs
// even when ctx is cancelled: the master must not keep a reservation we
// abandoned.
func (c *Client) revoke(ctx context.Context, keys []string, gens []uint64) {
	if len(keys) == 0 {
		return
	}
	rctx, cancel := c.rpcCtx(context.WithoutCancel(ctx))
	defer cancel()
	mem := storepb.ReplicaType_REPLICA_TYPE_MEMORY
	if len(keys) == 1 {
		if _, err := c.master.PutRevoke(rctx, &storepb.PutRevokeRequest{ClientId: c.id.pb(), Session: c.session, Key: keys[0], ReplicaType: mem, Generation: gens[0]}); err != nil {
			c.log.Warn("put revoke failed; the master reclaims the key after its discard timeout", "key", keys[0], "err", rpcerr.FromStatus(err))
		}
		return
	}
	resp, err := c.master.BatchPutRevoke(rctx, &storepb.BatchPutRevokeRequest{ClientId: c.id.pb(), Session: c.session, Keys: keys, ReplicaType: mem, Generations: gens})
	if err != nil {
		c.log.Warn("batch put revoke failed; the master reclaims the keys after its discard timeout", "keys", len(keys), "err", rpcerr.FromStatus(err))
		return
	}
	for i, r := range resp.Results {
		if r.ErrorCode != 0 && i < len(keys) {
			c.log.Warn("put revoke failed", "key", keys[i], "err", errcode.FromCode(errcode.Code(r.ErrorCode), r.Message))
		}
	}
}

// BatchPut stores values[i] under keys[i], answering per item (nil = stored).
// All items share rc (rc.Blocks, when set, gives each its block); the
// bytes of every item move in shared engine batches. Items of a class
// with reservations at hand (put-ahead) are committed in one CommitPut,
// the rest take BatchPutStart and BatchPutEnd. Items whose write to a
// segment failed are placed again together, as Put does.
func (c *Client) BatchPut(ctx context.Context, keys []string, values [][]byte, rc ReplicateConfig) []error {
	errs := make([]error, len(keys))
	if err := c.enter(); err != nil {
		fill(errs, err)
		return errs
	}
	defer c.leave()
	start := time.Now()
	defer func() {
		c.stats.batchPutLat.observe(time.Since(start))
		countOps(&c.stats.puts, &c.stats.putFail, len(errs), countErrs(errs))
	}()
	if len(values) != len(keys) {
		fill(errs, errcode.New(errcode.InvalidParams, "%d keys, %d values", len(keys), len(values)))
		return errs
	}
	if len(rc.Blocks) != 0 && len(rc.Blocks) != len(keys) {
		fill(errs, errcode.New(errcode.InvalidParams, "%d keys, %d blocks", len(keys), len(rc.Blocks)))
		return errs
	}
	if err := rc.check(); err != nil {
		fill(errs, err)
		return errs
	}
	var todo []int
	for i, k := range keys {
		if errs[i] = c.checkKey(k); errs[i] == nil {
			errs[i] = checkValue(values[i])
		}
		if errs[i] == nil {
			todo = append(todo, i)
		}
	}
	b := &batchPut{keys: keys, values: values, rc: &rc, rcpb: rc.pb(), errs: errs}
	for attempt := 0; len(todo) > 0; attempt++ {
		retry, fault := c.batchPutRound(ctx, b, todo, attempt == 0)
		if len(retry) == 0 || !c.retryAfter(ctx, fault, attempt) {
			break
		}
		todo = retry
	}
	return errs
}

// batchPut is one BatchPut call.
type batchPut struct {
	keys   []string
	values [][]byte
	rc     *ReplicateConfig
	rcpb   *storepb.ReplicateConfig
	errs   []error
}

func (b *batchPut) block(i int) *storepb.BlockMetadata {
	switch {
	case len(b.rc.Blocks) == 0:
		return nil
	case b.rc.Blocks[i] == nil:
		return &storepb.BlockMetadata{} // a repeated field holds no nil
	}
	return b.rc.Blocks[i].pb()
}

// aheadItem is a batch item put on a reservation it holds.
type aheadItem struct {
	i int
	k resvClass
	h heldResv
}

// roundScratch is a batchPutRound's working memory, pooled: allocated
// afresh it was the largest share of a batch put's allocations.
type roundScratch struct {
	held  []aheadItem
	slab  []xfer
	xs    []*xfer
	nreps []int
	gens  []uint64
	qs    []commitQ
}

var roundScratchPool = sync.Pool{New: func() any { return new(roundScratch) }}

// maxPooledItems bounds what a pooled scratch keeps: a rare huge batch
// does not pin its arrays.
const maxPooledItems = 1024

// release clears what the round wrote (values, keys and replies are not
// kept alive by the pool) and pools the scratch. A round fills each
// array once from its start and leaves it at the length it used, so
// clearing that length leaves the whole array zero.
func (sc *roundScratch) release() {
	if cap(sc.slab) > maxPooledItems || cap(sc.nreps) > maxPooledItems || cap(sc.held) > maxPooledItems {
		return
	}
	clear(sc.held)
	clear(sc.slab)
	clear(sc.xs)
	clear(sc.qs)
	sc.held, sc.slab, sc.xs, sc.qs = sc.held[:0], sc.slab[:0], sc.xs[:0], sc.qs[:0]
	roundScratchPool.Put(sc)
}

// zeroed returns s resized to n zero elements, reusing its array.
func zeroed[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// batchPutRound puts the items todo once (with put-ahead when ahead),
// filing each outcome in b.errs. It returns the items whose write failed
// at a segment, given back and ready to be placed again, and the fault.
func (c *Client) batchPutRound(ctx context.Context, b *batchPut, todo []int, ahead bool) ([]int, segFault) {
	keys, values, errs, rcpb := b.keys, b.values, b.errs, b.rcpb
	sc := roundScratchPool.Get().(*roundScratch)
	defer sc.release()
	held := sc.held[:0]
	var items []int // request position -> item, for BatchPutStart
	var okKeys []string
	var sizes []uint64
	// One clock read and one class encoding per size for the batch
	// (items are mostly of one size).
	now := time.Now()
	var cls resvClass
	for _, i := range todo {
		errs[i] = nil
		if ahead && c.ahead != nil {
			if size := uint64(len(values[i])); cls.size != size {
				cls = classOf(size, rcpb)
			}
			if h, ok := c.takeClass(cls, rcpb, now); ok {
				held = append(held, aheadItem{i, cls, h})
				continue
			}
		}
		items = append(items, i)
		okKeys = append(okKeys, keys[i])
		sizes = append(sizes, uint64(len(values[i])))
	}
	var replicas []putStarted
	var startErrs []error
	if len(items) > 0 {
		replicas, startErrs = c.rpcPutStart(ctx, okKeys, sizes, rcpb)
	}
	if c.beforeWrite != nil {
		c.beforeWrite()
	}
	// One slab of xfers for the batch.
	nx := 0
	for j := range items {
		if startErrs[j] == nil {
			nx += len(replicas[j].replicas)
		}
	}
	for _, a := range held {
		nx += len(a.h.reps)
	}
	// The slab never grows: xs points into it.
	if cap(sc.slab) < nx {
		sc.slab = make([]xfer, 0, nx)
	}
	slab := sc.slab[:0]
	xs := sc.xs[:0]
	var started []int
	sc.nreps = zeroed(sc.nreps, len(keys)) // by item: replicas written
	sc.gens = zeroed(sc.gens, len(keys))   // by item
	nreps, gens := sc.nreps, sc.gens
	var err error
	for j, i := range items {
		if errs[i] = startErrs[j]; errs[i] != nil {
			continue
		}
		started = append(started, i)
		nreps[i] = len(replicas[j].replicas)
		gens[i] = replicas[j].gen
		if xs, err = appendWriteXfers(xs, &slab, keys[i], values[i], replicas[j].replicas, i); err != nil {
			errs[i] = err
		}
	}
	for _, a := range held {
		nreps[a.i] = len(a.h.reps)
		if xs, err = appendWriteXfers(xs, &slab, keys[a.i], values[a.i], a.h.reps, a.i); err != nil {
			errs[a.i] = err
		}
	}
	sc.slab, sc.xs = slab, xs // for release to clear
	c.transfer(ctx, xs)
	var retry []int
	faulty := make(map[int]bool)
	for _, x := range xs {
		if x.err == nil {
			continue
		}
		if errs[x.item] == nil {
			errs[x.item] = x.err
		}
		if x.segFault && !faulty[x.item] {
			faulty[x.item] = true
			retry = append(retry, x.item)
		}
	}
	// Written reservations are committed; the others go back. committing
	// filters held in place (held is not read after).
	qs := sc.qs[:0]
	committing := held[:0]
	for _, a := range held {
		if errs[a.i] != nil {
			c.ahead.drop(a.h)
			continue
		}
		qs = append(qs, commitQ{key: keys[a.i], id: a.h.id, epoch: a.h.epoch, block: b.block(a.i), class: a.k, rc: rcpb})
		committing = append(committing, a)
	}
	sc.held, sc.qs = held, qs
	var done, failed []string
	var doneGens, failedGens []uint64
	var doneItems []int
	var blocks []*storepb.BlockMetadata
	for _, i := range started {
		if errs[i] == nil {
			done = append(done, keys[i])
			doneGens = append(doneGens, gens[i])
			doneItems = append(doneItems, i)
			if len(b.rc.Blocks) > 0 {
				blocks = append(blocks, b.block(i))
			}
		} else {
			failed = append(failed, keys[i])
			failedGens = append(failedGens, gens[i])
		}
	}
	// The commit of the reserved items and the end of the others run at
	// once: on a durable master each answers after a durability wait,
	// and one after the other a mixed batch would pay two.
	var endErrs []error
	var ended chan struct{}
	switch {
	case len(done) > 0 && len(qs) > 0:
		ended = make(chan struct{})
		go func() {
			defer close(ended)
			endErrs = c.rpcPutEnd(ctx, done, doneGens, blocks)
		}()
	case len(done) > 0:
		endErrs = c.rpcPutEnd(ctx, done, doneGens, blocks)
	}
	var gone []int
	if len(qs) > 0 {
		_, cerrs := c.rpcCommit(ctx, qs)
		for j, a := range committing {
			var g bool
			if g, errs[a.i] = c.settleAhead(a.k, a.h, cerrs[j]); g {
				gone = append(gone, a.i)
			} else if errs[a.i] == nil {
				c.stats.stored(nreps[a.i], rcpb.ReplicaNum)
			}
		}
	}
	if ended != nil {
		<-ended
	}
	for j, err := range endErrs {
		if i := doneItems[j]; err != nil {
			errs[i] = err
			failed = append(failed, keys[i])
			failedGens = append(failedGens, gens[i])
		} else {
			c.stats.stored(nreps[i], rcpb.ReplicaNum)
		}
	}
	c.revoke(ctx, failed, failedGens)
	// A reservation the master no longer had: put the item again, the
	// two-RPC way (rare: given back, lost with its segment, expired).
	for _, i := range gone {
		errs[i] = c.putTwoRPC(ctx, keys[i], values[i], rcpb, b.block(i), 0)
	}
	return retry, faultOf(xs)
}

// inPieces sends n items in pieces of at most storepb.MaxBatchItems
// (the master refuses larger batches) and joins the answers in order.
func inPieces[R any](n int, send func(lo, hi int) ([]R, []error)) ([]R, []error) {
	rs, errs := make([]R, 0, n), make([]error, 0, n)
	for lo := 0; lo < n; lo += storepb.MaxBatchItems {
		r, e := send(lo, min(n, lo+storepb.MaxBatchItems))
		rs, errs = append(rs, r...), append(errs, e...)
	}
	return rs, errs
}

func fill(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

func countErrs(errs []error) int {
	n := 0
	for _, e := range errs {
		if e != nil {
			n++
		}
	}
	return n
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
