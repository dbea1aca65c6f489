package master

import (
	"errors"

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
	if err := m.checkKey(key); err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, errcode.New(errcode.InvalidParams, "size 0")
	}
	n, err := m.checkConfig(&rc)
	if err != nil {
		return nil, err
	}
	return m.putStart(client, key, size, &rc, n)
}

func (m *Master) putStart(client UUID, key string, size uint64, rc *ReplicateConfig, n int) ([]Replica, error) {
	req := alloc.Request{Size: size, Replicas: n, Preferred: rc.Preferred, Local: client, SameNode: rc.SameNode,
		MinReplicas: rc.MinReplicas}
	ttl := m.pinTTL(rc) // kept per object only when it is not the default
	sh := m.shardOf(key)
	for attempt := 0; ; attempt++ {
		// Suspect segments only on the second try: making room elsewhere
		// beats a write that will likely fail.
		req.NoSuspect = attempt == 0 && m.alloc.Suspects() > 0
		sh.mu.Lock()
		now := m.now()
		if err := m.claimKey(sh, key, now); err != nil {
			sh.unlock()
			return nil, err
		}
		segs, err := m.alloc.Choose(req)
		var reps []Replica
		if err == nil {
			var o object
			op := &Op{Kind: OpPutStart, Time: now, Key: key, Client: client, Size: size, SoftPin: rc.SoftPin,
				SoftPinTTL: ttl, HardPin: rc.HardPin, Segments: segs}
			if err = m.apply(sh, op, &applyArgs{obj: &o, minReps: rc.MinReplicas}); err == nil {
				reps = m.replicas(&o)
			}
		}
		sh.unlock()
		if err == nil {
			return reps, nil
		}
		if attempt > 0 || !errors.Is(err, errcode.ErrNoAvailableHandle) {
			return nil, err
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
				return nil, err
			}
		case !req.NoSuspect:
			return nil, err
		}
	}
}

// claimKey readies key for a new object: a complete object, or an
// unfinished one younger than PutDiscardTimeout, is ErrObjectAlreadyExists;
// an older unfinished one is taken over (OpDiscard). The shard is locked.
func (m *Master) claimKey(sh *shard, key string, now int64) error {
	o := sh.get(key)
	switch {
	case o == nil:
		return nil
	case o.complete() || now-o.lease < int64(m.cfg.PutDiscardTimeout):
		return errcode.New(errcode.ObjectAlreadyExists, "key %q", key)
	}
	m.discardedPuts.Add(1)
	return m.apply(sh, &Op{Kind: OpDiscard, Time: now, Key: key}, &applyArgs{})
}

// PutEnd makes the object visible (COMPLETE). Only the client that
// started the put may end it (ErrIllegalClient); a missing key is
// ErrObjectNotFound; ending a complete object again succeeds (a retried
// RPC). block, when not nil, is passed to the Stored event.
func (m *Master) PutEnd(client UUID, key string, rt ReplicaType, block *BlockMeta) error {
	return m.finishPut(&Op{Kind: OpPutEnd, Key: key, Client: client, Block: block}, rt)
}

// PutRevoke abandons an unfinished put and frees its space at once. A
// missing key is ErrObjectNotFound, a complete one ErrInvalidWrite,
// another client's ErrIllegalClient.
func (m *Master) PutRevoke(client UUID, key string, rt ReplicaType) error {
	return m.finishPut(&Op{Kind: OpPutRevoke, Key: key, Client: client}, rt)
}

// finishPut applies op (PutEnd or PutRevoke) to op.Client's unfinished
// put of op.Key.
func (m *Master) finishPut(op *Op, rt ReplicaType) error {
	if err := m.checkKey(op.Key); err != nil {
		return err
	}
	if rt != Memory {
		return errcode.New(errcode.InvalidParams, "replica type %d: the master places memory replicas only", rt)
	}
	sh := m.shardOf(op.Key)
	sh.mu.Lock()
	defer sh.unlock()
	o := sh.get(op.Key)
	switch {
	case o == nil:
		return errcode.New(errcode.ObjectNotFound, "key %q", op.Key)
	case o.complete() && op.Kind == OpPutEnd:
		return nil // a retried PutEnd; the writer is no longer recorded
	case o.complete():
		return errcode.New(errcode.InvalidWrite, "key %q is already complete", op.Key)
	case o.owner() != op.Client:
		return errcode.New(errcode.IllegalClient, "key %q is being written by another client", op.Key)
	}
	op.Time = m.now()
	return m.apply(sh, op, &applyArgs{})
}

// PutStartResult is one item of BatchPutStart.
type PutStartResult struct {
	Replicas []Replica
	Err      error
}

// BatchPutStart is PutStart for many keys with one config; sizes has one
// entry per key. Items fail independently.
func (m *Master) BatchPutStart(client UUID, keys []string, sizes []uint64, rc ReplicateConfig) ([]PutStartResult, error) {
	if len(keys) != len(sizes) {
		return nil, errcode.New(errcode.InvalidParams, "%d keys, %d sizes", len(keys), len(sizes))
	}
	out := make([]PutStartResult, len(keys))
	n, err := m.checkConfig(&rc)
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out, nil
	}
	for i, key := range keys {
		if err := m.checkKey(key); err != nil {
			out[i].Err = err
			continue
		}
		if sizes[i] == 0 {
			out[i].Err = errcode.New(errcode.InvalidParams, "size 0")
			continue
		}
		out[i].Replicas, out[i].Err = m.putStart(client, key, sizes[i], &rc, n)
	}
	return out, nil
}

// BatchPutEnd is PutEnd for many keys; blocks is empty or has one entry
// per key.
func (m *Master) BatchPutEnd(client UUID, keys []string, rt ReplicaType, blocks []*BlockMeta) ([]error, error) {
	if len(blocks) != 0 && len(blocks) != len(keys) {
		return nil, errcode.New(errcode.InvalidParams, "%d keys, %d blocks", len(keys), len(blocks))
	}
	out := make([]error, len(keys))
	for i, key := range keys {
		var b *BlockMeta
		if len(blocks) > 0 {
			b = blocks[i]
		}
		out[i] = m.PutEnd(client, key, rt, b)
	}
	return out, nil
}

// BatchPutRevoke is PutRevoke for many keys.
func (m *Master) BatchPutRevoke(client UUID, keys []string, rt ReplicaType) []error {
	out := make([]error, len(keys))
	for i, key := range keys {
		out[i] = m.PutRevoke(client, key, rt)
	}
	return out
}
