package master

import (
	"context"
	"errors"
	"log/slog"
	"slices"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// checkConfig validates a ReplicateConfig and returns the replica count.
func (m *Master) checkConfig(rc *ReplicateConfig) (int, error) {
	n := rc.Replicas
	switch {
	case n < 0 || n > m.cfg.MaxReplicas:
		return 0, errcode.New(errcode.InvalidParams, "replica count %d outside [0, %d]", n, m.cfg.MaxReplicas)
	case rc.SoftPinTTL < 0:
		return 0, errcode.New(errcode.InvalidParams, "negative soft pin TTL %v", rc.SoftPinTTL)
	case rc.SoftPinTTL > m.cfg.MaxSoftPinTTL:
		return 0, errcode.New(errcode.InvalidParams, "soft pin TTL %v above the maximum %v", rc.SoftPinTTL, m.cfg.MaxSoftPinTTL)
	case rc.SoftPin && rc.HardPin:
		return 0, errcode.New(errcode.InvalidParams, "soft and hard pin are exclusive")
	case rc.MinReplicas < 0 || rc.MinReplicas > max(n, 1):
		return 0, errcode.New(errcode.InvalidParams, "min replicas %d outside [0, %d] (the replica count)", rc.MinReplicas, max(n, 1))
	}
	for _, p := range rc.Preferred {
		if p == "" {
			return 0, errcode.New(errcode.InvalidParams, "empty preferred segment name")
		}
	}
	return max(n, 1), nil
}

// PutStart reserves space for size bytes under key, written by client:
// the replicas it returns (status PROCESSING) are where the client writes,
// before PutEnd makes the object visible. A complete object, or an
// unfinished one younger than PutDiscardTimeout, is
// ErrObjectAlreadyExists; an older unfinished one is taken over (its
// space quarantined until its PutReleaseTimeout). When no segment can
// hold the object, one eviction round runs and placement is tried once
// more; then ErrNoAvailableHandle.
func (m *Master) PutStart(client UUID, key string, size uint64, rc ReplicateConfig) ([]Replica, error) {
	reps, _, err := m.PutStartGen(client, key, size, rc)
	return reps, err
}

// PutStartGen is PutStart that also returns the put's generation (never
// 0): a number unique to this put of the key, for PutEndGen and
// PutRevokeGen, so that a writer whose put was taken over (or removed)
// cannot end or revoke its successor's.
func (m *Master) PutStartGen(client UUID, key string, size uint64, rc ReplicateConfig) ([]Replica, uint64, error) {
	if err := m.checkKey(key); err != nil {
		return nil, 0, err
	}
	if size == 0 {
		return nil, 0, errcode.New(errcode.InvalidParams, "size 0")
	}
	n, err := m.checkConfig(&rc)
	if err != nil {
		return nil, 0, err
	}
	return m.putStart(client, key, size, &rc, n, 0, nil, nil, nil)
}

// nextGen gives a put generation: a master-wide counter whose low 32 bits
// (what a record keeps) are never 0.
func (m *Master) nextGen() uint64 {
	for {
		if g := m.putGen.Add(1); uint32(g) != 0 {
			return g
		}
	}
}

// putStart places one put. now, when not 0, is the time of its first
// attempt (a batch reads the clock once); else the clock is read under the
// shard lock. slot, when not nil, is where the first attempt's op goes (a
// batch allocates its ops at once); the replicas are appended to buf; sc,
// when not nil, lends the batch's placement buffers.
func (m *Master) putStart(client UUID, key string, size uint64, rc *ReplicateConfig, n int, now int64, slot *Op, buf []Replica, sc *batchScratch) ([]Replica, uint64, error) {
	req := alloc.Request{Size: size, Replicas: n, Preferred: rc.Preferred, Local: client, SameNode: rc.SameNode,
		MinReplicas: rc.MinReplicas}
	ttl := m.pinTTL(rc) // kept per object only when it is not the default
	sh, h := m.locate(key)
	for attempt := 0; ; attempt++ {
		// Suspect segments only on the second try: making room elsewhere
		// beats a write that will likely fail.
		req.NoSuspect = attempt == 0 && m.alloc.Suspects() > 0
		sh.mu.Lock()
		if now == 0 || attempt > 0 {
			now = m.now()
		}
		if err := m.claimKey(sh, h, key, now); err != nil {
			sh.unlock()
			return nil, 0, err
		}
		req.Into = nil
		if sc != nil && attempt == 0 && cap(sc.segs)-len(sc.segs) >= n {
			k := len(sc.segs)
			req.Into, sc.segs = sc.segs[k:k:k+n], sc.segs[:k+n]
		}
		segs, err := m.alloc.Choose(req)
		var reps []Replica
		var gen uint64
		if sc != nil {
			gen = sc.nextGen(m)
		} else {
			gen = m.nextGen()
		}
		if err == nil {
			var o object
			op := slot
			if op == nil || attempt > 0 {
				op = new(Op)
			}
			*op = Op{Kind: OpPutStart, Time: now, Key: key, Client: client, Size: size, SoftPin: rc.SoftPin,
				SoftPinTTL: ttl, HardPin: rc.HardPin, Segments: segs, Gen: gen}
			args := &applyArgs{obj: &o, minReps: rc.MinReplicas}
			if sc != nil {
				args.scratch = &sc.place
			}
			if err = m.apply(sh, h, op, args); err == nil {
				reps = m.appendReplicas(buf, &o)
			}
		}
		sh.unlock()
		if err == nil {
			return reps, gen, nil
		}
		if attempt > 0 || !errors.Is(err, errcode.ErrNoAvailableHandle) {
			return nil, 0, err
		}
		// Eviction cannot make room for more than a segment holds, nor
		// add segments; when only suspect segments could take the put,
		// the second try uses them without evicting.
		least := max(rc.MinReplicas, 1)
		canEvict := alloc.Reserved(size) <= m.alloc.LargestSegment() && m.alloc.Placeable(!req.NoSuspect) >= least
		switch {
		case canEvict:
			// Make room and try once more (outside the shard lock:
			// eviction takes shard locks itself).
			if r := m.evict(now); r.Keys == 0 && !req.NoSuspect {
				return nil, 0, err
			}
		case !req.NoSuspect:
			return nil, 0, err
		}
	}
}

// claimKey readies key for a new object: a complete object, or an
// unfinished one younger than PutDiscardTimeout, is ErrObjectAlreadyExists;
// an older unfinished one is taken over (OpDiscard). The shard is locked.
func (m *Master) claimKey(sh *shard, h uint64, key string, now int64) error {
	o := sh.get(key, h)
	switch {
	case o == nil:
		return nil
	case o.complete() || now-o.lease < int64(m.cfg.PutDiscardTimeout):
		return errcode.New(errcode.ObjectAlreadyExists, "key %q", key)
	}
	m.discardedPuts.Add(1)
	return m.apply(sh, h, &Op{Kind: OpDiscard, Time: now, Key: key}, &applyArgs{})
}

// PutEnd makes the object visible (COMPLETE). Only the client that
// started the put may end it (ErrIllegalClient); a missing key is
// ErrObjectNotFound; ending a complete object again succeeds (a retried
// RPC). block, when not nil, is passed to the Stored event. PutEnd does
// not check the put's generation: PutEndGen does.
func (m *Master) PutEnd(client UUID, key string, rt ReplicaType, block *BlockMeta) error {
	return m.PutEndGen(client, key, 0, rt, block)
}

// PutEndGen is PutEnd of the put PutStartGen numbered gen. When the key
// holds another put (this one was taken over, or removed and the key put
// again), finished or not, it is ErrReplicaIsGone: the bytes the caller
// wrote were not stored. gen 0 is not checked (PutEnd).
func (m *Master) PutEndGen(client UUID, key string, gen uint64, rt ReplicaType, block *BlockMeta) error {
	return m.finishPut(&Op{Kind: OpPutEnd, Key: key, Client: client, Block: block, Gen: gen}, rt, 0)
}

// PutRevoke abandons an unfinished put and frees its space at once. A
// missing key is ErrObjectNotFound, a complete one ErrInvalidWrite,
// another client's ErrIllegalClient. It does not check the generation.
func (m *Master) PutRevoke(client UUID, key string, rt ReplicaType) error {
	return m.PutRevokeGen(client, key, 0, rt)
}

// PutRevokeGen is PutRevoke of the put numbered gen: another put of the
// key is ErrReplicaIsGone and is left alone (gen 0 is not checked).
func (m *Master) PutRevokeGen(client UUID, key string, gen uint64, rt ReplicaType) error {
	return m.finishPut(&Op{Kind: OpPutRevoke, Key: key, Client: client, Gen: gen}, rt, 0)
}

// finishPut applies op (PutEnd or PutRevoke) to op.Client's unfinished
// put of op.Key, at now (0: the clock, read under the shard lock).
func (m *Master) finishPut(op *Op, rt ReplicaType, now int64) error {
	if err := m.checkKey(op.Key); err != nil {
		return err
	}
	if rt != Memory {
		return errcode.New(errcode.InvalidParams, "replica type %d: the master places memory replicas only", rt)
	}
	if op.Kind == OpPutEnd {
		m.invBarrier() // a new generation is visible only once caches dropped the old
	}
	sh, h := m.locate(op.Key)
	sh.mu.Lock()
	err := m.finishPutLocked(sh, h, op, now)
	sh.unlock()
	m.flushEvents() // after the unlock
	return err
}

// finishPutLocked is finishPut under the key's shard lock. (No defers in
// finishPut: with this many returns they are not open-coded, and cost
// more than the rest of a batch item's bookkeeping.)
func (m *Master) finishPutLocked(sh *shard, h uint64, op *Op, now int64) error {
	o := sh.get(op.Key, h)
	switch {
	case o == nil:
		return errcode.New(errcode.ObjectNotFound, "key %q", op.Key)
	case !o.isGen(op.Gen):
		return errcode.New(errcode.ReplicaIsGone, "key %q: put generation %d was taken over or removed; its replicas are gone", op.Key, op.Gen)
	case o.complete() && op.Kind == OpPutEnd:
		return nil // a retried PutEnd; the writer is no longer recorded
	case o.complete():
		return errcode.New(errcode.InvalidWrite, "key %q is already complete", op.Key)
	case o.owner() != op.Client:
		return errcode.New(errcode.IllegalClient, "key %q is being written by another client", op.Key)
	}
	if now == 0 {
		now = m.now()
	}
	op.Time = now
	if err := m.apply(sh, h, op, &applyArgs{found: o}); err != nil {
		return err
	}
	if op.Kind == OpPutEnd && m.debugOn() {
		m.logPut(op.Key, sh.get(op.Key, h), op.Client)
	}
	return nil
}

// debugOn says whether debug lines are logged: checked before building
// one on the put path, where building it allocates.
func (m *Master) debugOn() bool { return m.cfg.Logger.Enabled(context.Background(), slog.LevelDebug) }

// logPut logs a finished put at debug (shard lock held).
func (m *Master) logPut(key string, o *object, client UUID) {
	if o != nil {
		m.cfg.Logger.Debug("master: put", "key", key, "size", o.size(), "replicas", o.nrep(), "client", client.String())
	}
}

// PutStartResult is one item of BatchPutStart.
type PutStartResult struct {
	Replicas []Replica
	Gen      uint64 // the put's generation (PutStartGen)
	Err      error
}

// BatchPutStart is PutStart for many keys with one config; sizes has one
// entry per key. Items fail independently.
func (m *Master) BatchPutStart(client UUID, keys []string, sizes []uint64, rc ReplicateConfig) ([]PutStartResult, error) {
	return m.BatchPutStartInto(client, keys, sizes, rc, nil)
}

// BatchPutStartInto is BatchPutStart with its results in bufs (nil:
// new arrays). They stay valid until bufs is used again or Reset.
func (m *Master) BatchPutStartInto(client UUID, keys []string, sizes []uint64, rc ReplicateConfig, bufs *BatchBuffers) ([]PutStartResult, error) {
	if len(keys) != len(sizes) {
		return nil, errcode.New(errcode.InvalidParams, "%d keys, %d sizes", len(keys), len(sizes))
	}
	if bufs == nil {
		bufs = new(BatchBuffers) // new arrays that no one keeps
	}
	out := reuse(&bufs.puts, len(keys))
	n, err := m.checkConfig(&rc)
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out, nil
	}
	now := m.now() // one clock read for the batch (150 ns on some VMs)
	// One allocation for the batch's ops and one for its replicas, not
	// one each per item (the sink keeps ops: each item has its own slot;
	// without a sink nothing keeps an op, and one serves every item).
	ops, one := m.batchOps(len(keys))
	buf := slices.Grow(bufs.replicas[:0], len(keys)*max(n, 1))
	sc := newBatchScratch(len(keys), max(n, 1))
	for i, key := range keys {
		if err := m.checkKey(key); err != nil {
			out[i].Err = err
			continue
		}
		if sizes[i] == 0 {
			out[i].Err = errcode.New(errcode.InvalidParams, "size 0")
			continue
		}
		slot := one
		if ops != nil {
			slot = &ops[i]
		}
		reps, gen, err := m.putStart(client, key, sizes[i], &rc, n, now, slot, buf, sc)
		if err == nil {
			out[i].Replicas = slices.Clip(reps[len(buf):])
			buf = reps
		}
		out[i].Gen, out[i].Err = gen, err
	}
	bufs.replicas = buf // an item may have grown it
	return out, nil
}

// batchOps gives a batch of n items its ops: one slot per item when an
// OpSink keeps them, else (ops nil) one op every item reuses, since
// nothing holds an op past its item.
func (m *Master) batchOps(n int) (ops []Op, one *Op) {
	if m.oplog != nil {
		return make([]Op, n), nil
	}
	return nil, new(Op)
}

// batchScratch holds a batch put's buffers: segs and place.addrs are
// carved into its ops (n per item), place.ps is reused by every item.
type batchScratch struct {
	segs  []uint32
	place placeScratch
	// gens are the batch's put generations, taken from Master.putGen in
	// one step: a counter every put wrote was a cache line both cores
	// wrote in turn. genNext is the next to hand out, genEnd the last.
	genNext, genEnd uint64
	items           int
}

// nextGen is Master.nextGen from the batch's block.
func (sc *batchScratch) nextGen(m *Master) uint64 {
	for {
		if sc.genNext == 0 || sc.genNext > sc.genEnd {
			n := uint64(max(sc.items, 1))
			sc.genEnd = m.putGen.Add(n)
			sc.genNext = sc.genEnd - n + 1
		}
		g := sc.genNext
		sc.genNext++
		if uint32(g) != 0 {
			return g
		}
	}
}

func newBatchScratch(items, n int) *batchScratch {
	return &batchScratch{items: items, segs: make([]uint32, 0, items*n),
		place: placeScratch{addrs: make([]uint64, 0, items*n), ps: make([]alloc.Placement, 0, n)}}
}

// BatchPutEnd is PutEnd for many keys; blocks is empty or has one entry
// per key.
func (m *Master) BatchPutEnd(client UUID, keys []string, rt ReplicaType, blocks []*BlockMeta) ([]error, error) {
	return m.BatchPutEndGen(client, keys, nil, rt, blocks)
}

// BatchPutEndGen is PutEndGen for many keys; gens and blocks are empty or
// have one entry per key.
func (m *Master) BatchPutEndGen(client UUID, keys []string, gens []uint64, rt ReplicaType, blocks []*BlockMeta) ([]error, error) {
	if len(blocks) != 0 && len(blocks) != len(keys) {
		return nil, errcode.New(errcode.InvalidParams, "%d keys, %d blocks", len(keys), len(blocks))
	}
	if len(gens) != 0 && len(gens) != len(keys) {
		return nil, errcode.New(errcode.InvalidParams, "%d keys, %d generations", len(keys), len(gens))
	}
	out := make([]error, len(keys))
	ops, one := m.batchOps(len(keys))
	now := m.now()
	for i, key := range keys {
		var b *BlockMeta
		if len(blocks) > 0 {
			b = blocks[i]
		}
		var g uint64
		if len(gens) > 0 {
			g = gens[i]
		}
		op := one
		if ops != nil {
			op = &ops[i]
		}
		*op = Op{Kind: OpPutEnd, Key: key, Client: client, Block: b, Gen: g}
		out[i] = m.finishPut(op, rt, now)
	}
	return out, nil
}

// BatchPutRevoke is PutRevoke for many keys.
func (m *Master) BatchPutRevoke(client UUID, keys []string, rt ReplicaType) []error {
	out, _ := m.BatchPutRevokeGen(client, keys, nil, rt)
	return out
}

// BatchPutRevokeGen is PutRevokeGen for many keys; gens is empty or has
// one entry per key.
func (m *Master) BatchPutRevokeGen(client UUID, keys []string, gens []uint64, rt ReplicaType) ([]error, error) {
	if len(gens) != 0 && len(gens) != len(keys) {
		return nil, errcode.New(errcode.InvalidParams, "%d keys, %d generations", len(keys), len(gens))
	}
	out := make([]error, len(keys))
	for i, key := range keys {
		var g uint64
		if len(gens) > 0 {
			g = gens[i]
		}
		out[i] = m.PutRevokeGen(client, key, g, rt)
	}
	return out, nil
}
