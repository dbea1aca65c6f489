package master

import (
	"slices"
	"time"

	"github.com/crescent-kv/crescent/store/errcode"
)

// GetReplicaList returns a complete object's replicas and grants a read
// lease: lease = max(lease, now+LeaseTTL); the returned TTL is LeaseTTL.
// It also renews a soft pin. A missing key is ErrObjectNotFound, an
// unfinished put ErrReplicaIsNotReady.
func (m *Master) GetReplicaList(key string) ([]Replica, time.Duration, error) {
	return m.getReplicaList(key, 0, nil)
}

// getReplicaList is GetReplicaList at now (0: the clock, read under the
// shard lock), its replicas appended to buf (nil: a new slice).
func (m *Master) getReplicaList(key string, now int64, buf []Replica) ([]Replica, time.Duration, error) {
	if err := m.checkKey(key); err != nil {
		return nil, 0, err
	}
	sh, h := m.locate(key)
	sh.mu.Lock()
	defer sh.unlock()
	o := sh.get(key, h)
	if o == nil {
		return nil, 0, errcode.New(errcode.ObjectNotFound, "key %q", key)
	}
	if !o.complete() {
		return nil, 0, errcode.New(errcode.ReplicaIsNotReady, "key %q is still being written", key)
	}
	if now == 0 {
		now = m.now()
	}
	m.grantLease(o, now)
	if buf == nil {
		buf = make([]Replica, 0, o.nrep())
	}
	return m.appendReplicas(buf, o), m.cfg.LeaseTTL, nil
}

// GetResult is one item of BatchGetReplicaList.
type GetResult struct {
	Replicas []Replica
	LeaseTTL time.Duration
	Err      error
}

// BatchGetReplicaList is GetReplicaList for many keys.
func (m *Master) BatchGetReplicaList(keys []string) []GetResult {
	return m.BatchGetReplicaListInto(keys, nil)
}

// BatchGetReplicaListInto is BatchGetReplicaList with its results in
// bufs (nil: new arrays; one replica array for the batch either way).
// They stay valid until bufs is used again or Reset.
func (m *Master) BatchGetReplicaListInto(keys []string, bufs *BatchBuffers) []GetResult {
	if bufs == nil {
		bufs = new(BatchBuffers) // new arrays that no one keeps
	}
	out := reuse(&bufs.gets, len(keys))
	buf := slices.Grow(bufs.replicas[:0], len(keys))
	now := m.now() // one clock read for the batch
	for i, k := range keys {
		reps, ttl, err := m.getReplicaList(k, now, buf)
		if err == nil {
			out[i].Replicas = slices.Clip(reps[len(buf):])
			buf = reps
		}
		out[i].LeaseTTL, out[i].Err = ttl, err
	}
	bufs.replicas = buf // an item may have grown it
	return out
}

// BatchBuffers are the result and replica arrays of a batch reply
// (BatchPutStartInto, BatchGetReplicaListInto), kept for the next batch
// by a caller that is done with the results once it has encoded its
// reply: a put batch of 128 allocated about 16 KB of them, for the GC
// to scan, per call. The zero value is ready.
type BatchBuffers struct {
	puts     []PutStartResult
	gets     []GetResult
	replicas []Replica
}

// Reset drops what the last batch left in b (its errors and segment
// names) and keeps the arrays.
func (b *BatchBuffers) Reset() {
	clear(b.puts)
	clear(b.gets)
	clear(b.replicas)
	b.puts, b.gets, b.replicas = b.puts[:0], b.gets[:0], b.replicas[:0]
}

// Cap is how many items b holds room for, so that a pool can drop
// buffers a rare huge batch grew.
func (b *BatchBuffers) Cap() int { return max(cap(b.puts), cap(b.gets), cap(b.replicas)) }

// reuse makes *kept an array of n zero items, in its old storage when
// that has room. Past its length a kept array is zero (Reset and reuse
// clear what they shorten), so only the last batch's items need
// clearing: nothing after a Reset.
func reuse[T any](kept *[]T, n int) []T {
	clear(*kept)
	out := slices.Grow((*kept)[:0], n)[:n]
	*kept = out
	return out
}

// ExistKey reports whether key is a complete object. Unless noLease, a
// true answer grants a lease as GetReplicaList does (the reference's
// behaviour); probes should pass noLease so they do not hold objects back
// from eviction. An unfinished put does not exist yet.
func (m *Master) ExistKey(key string, noLease bool) (bool, error) {
	if err := m.checkKey(key); err != nil {
		return false, err
	}
	sh, h := m.locate(key)
	sh.mu.Lock()
	defer sh.unlock()
	o := sh.get(key, h)
	if o == nil || !o.complete() {
		return false, nil
	}
	if !noLease {
		m.grantLease(o, m.now())
	}
	return true, nil
}

// BatchExistKey is ExistKey for many keys.
func (m *Master) BatchExistKey(keys []string, noLease bool) ([]bool, []error) {
	ok := make([]bool, len(keys))
	errs := make([]error, len(keys))
	for i, k := range keys {
		ok[i], errs[i] = m.ExistKey(k, noLease)
	}
	return ok, errs
}
