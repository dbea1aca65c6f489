package master

import (
	"time"

	"github.com/crescent-kv/crescent/store/errcode"
)

// GetReplicaList returns a complete object's replicas and grants a read
// lease: lease = max(lease, now+LeaseTTL); the returned TTL is LeaseTTL.
// It also renews a soft pin. A missing key is ErrObjectNotFound, an
// unfinished put ErrReplicaIsNotReady.
func (m *Master) GetReplicaList(key string) ([]Replica, time.Duration, error) {
	return m.getReplicaList(key, 0)
}

// getReplicaList is GetReplicaList at now (0: the clock, read under the
// shard lock).
func (m *Master) getReplicaList(key string, now int64) ([]Replica, time.Duration, error) {
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
	return m.replicas(o), m.cfg.LeaseTTL, nil
}

// GetResult is one item of BatchGetReplicaList.
type GetResult struct {
	Replicas []Replica
	LeaseTTL time.Duration
	Err      error
}

// BatchGetReplicaList is GetReplicaList for many keys.
func (m *Master) BatchGetReplicaList(keys []string) []GetResult {
	out := make([]GetResult, len(keys))
	now := m.now() // one clock read for the batch
	for i, k := range keys {
		out[i].Replicas, out[i].LeaseTTL, out[i].Err = m.getReplicaList(k, now)
	}
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
