package master

import (
	"time"

	"github.com/crescent-kv/crescent/store/errcode"
)

// QueryKey describes one object for administrators; it grants no lease.
func (m *Master) QueryKey(key string) (KeyInfo, error) {
	if err := m.checkKey(key); err != nil {
		return KeyInfo{}, err
	}
	sh, h := m.locate(key)
	sh.mu.Lock()
	defer sh.unlock()
	o := sh.get(key, h)
	if o == nil {
		return KeyInfo{}, errcode.New(errcode.ObjectNotFound, "key %q", key)
	}
	now := m.now()
	ki := KeyInfo{Key: key, Size: o.size(), Complete: o.complete(), Replicas: m.replicas(o),
		SoftPin: o.has(fSoftPin), HardPin: o.has(fHardPin)}
	if !o.complete() {
		ki.Owner = o.owner()
		ki.Started = time.Unix(0, o.lease)
		return ki, nil
	}
	if o.has(fLeased) {
		ki.LeaseDeadline = time.Unix(0, o.lease)
		ki.Leased = o.leased(now)
	}
	if ki.SoftPin {
		ki.SoftPinDeadline = time.Unix(0, o.pin())
	}
	return ki, nil
}

// WalkKeys calls fn for every key (finished or not), one shard at a time,
// until fn returns false. fn runs under a shard lock: it must not call the
// Master.
func (m *Master) WalkKeys(fn func(key string, complete bool) bool) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		stop := false
		sh.each(func(k string, o *object) bool {
			stop = !fn(k, o.complete())
			return !stop
		})
		sh.unlock()
		if stop {
			return
		}
	}
}

// AllKeys returns every complete object's key, in no particular order.
func (m *Master) AllKeys() []string {
	keys, _ := m.counts()
	out := make([]string, 0, keys)
	m.WalkKeys(func(k string, complete bool) bool {
		if complete {
			out = append(out, k)
		}
		return true
	})
	return out
}

// AllSegments describes every mounted segment, in mount order.
func (m *Master) AllSegments() []SegmentInfo {
	sts := m.alloc.Segments()
	out := make([]SegmentInfo, len(sts))
	for i, st := range sts {
		out[i] = segInfo(st)
	}
	return out
}

// counts returns the keys and the unfinished puts among them, from the
// shards: master-wide counters written by every put were cache lines
// that both cores wrote in turn.
func (m *Master) counts() (keys, pending int64) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		keys += int64(sh.n)
		pending += int64(sh.pending)
		sh.mu.Unlock()
	}
	return keys, pending
}

// Stats returns the master's counters.
func (m *Master) Stats() Stats {
	capacity, used := m.alloc.Totals()
	keys, pending := m.counts()
	m.clientMu.RLock()
	clients := len(m.clients)
	m.clientMu.RUnlock()
	return Stats{
		Capacity:        capacity,
		Allocated:       used,
		Keys:            keys,
		PendingKeys:     pending,
		SoftPinnedKeys:  m.softPinned.Load(),
		HardPinnedKeys:  m.hardPinned.Load(),
		Segments:        len(m.alloc.Segments()),
		ActiveClients:   clients,
		Quarantined:     m.quarantinedN.Load(),
		Reservations:    m.reservations(),
		ReservedBytes:   uint64(m.reservedBytes.Load()),
		EvictionRuns:    m.evictRuns.Load(),
		EvictedKeys:     m.evictedKeys.Load(),
		EvictedBytes:    m.evictedBytes.Load(),
		ExpiredClients:  m.expiredClients.Load(),
		DiscardedPuts:   m.discardedPuts.Load(),
		ReleasedPuts:    m.releasedPuts.Load(),
		DroppedReplicas: m.droppedReplicas.Load(),
		LostKeys:        m.lostKeys.Load(),
		SuspectSegments: m.alloc.Suspects(),
		SegmentReports:  m.segmentReports.Load(),

		DepartedClients:   m.departedClients.Load(),
		UnmountedReplicas: m.unmountedReplicas.Load(),
		UnmountedKeys:     m.unmountedKeys.Load(),
	}
}

// hasKeys reports whether any shard holds an object.
func (m *Master) hasKeys() bool {
	keys, _ := m.counts()
	return keys != 0
}
