package master

import (
	"sync"
	"sync/atomic"
)

// evQueue carries events from under the master's locks to the sink.
// Under a lock, emit only appends here (mu is a leaf); the caller, once it
// holds no shard, reservation, allocator or quarantine lock, calls
// flushEvents, which hands the sink every event queued so far, in queue
// order, one deliverer at a time. Events are queued under the lock of the
// key they concern, so queue order is lock order and the events of one
// key keep their order. A sink that blocks (the Block overflow policy)
// holds back the callers whose events wait behind it, never a shard.
type evQueue struct {
	mu     sync.Mutex
	q      []*Event
	queued uint64 // events appended so far (under mu)

	deliver sync.Mutex    // one deliverer at a time
	done    atomic.Uint64 // events handed to the sink so far
}

// emit queues e for the sink (nothing on replay, or when quiet).
func (m *Master) emit(a *applyArgs, e *Event) {
	if m.ev == nil || a.replay || a.quiet {
		return
	}
	q := &m.evq
	q.mu.Lock()
	q.q = append(q.q, e)
	q.queued++
	q.mu.Unlock()
}

// flushEvents returns once every event queued before the call has been
// handed to the sink. Call it holding none of the shard, reservation,
// allocator, quarantine or segment locks.
func (m *Master) flushEvents() {
	if m.ev == nil {
		return
	}
	q := &m.evq
	q.mu.Lock()
	upTo := q.queued
	q.mu.Unlock()
	if q.done.Load() >= upTo {
		return
	}
	q.deliver.Lock()
	defer q.deliver.Unlock()
	for q.done.Load() < upTo {
		q.mu.Lock()
		batch := q.q
		q.q = nil
		q.mu.Unlock()
		for i, e := range batch {
			batch[i] = nil
			m.ev.Emit(e)
			q.done.Add(1)
		}
	}
}
