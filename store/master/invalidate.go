package master

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crescent-kv/crescent/store/errcode"
)

// Defaults and bounds of the invalidation subscriptions.
const (
	DefaultInvalidationTTL = time.Second
	DefaultMaxSubscribers  = 1024
	// MaxInvalidationQueue bounds one subscriber's unacknowledged
	// invalidations; past it the subscriber is told to drop everything.
	MaxInvalidationQueue = 4096
	// MaxInvalidationItems and MaxInvalidationBytes bound one answer.
	MaxInvalidationItems = 1024
	MaxInvalidationBytes = 1 << 20
)

// Invalidation says that the complete object Key of put generation Gen
// is gone (removed, evicted, lost); a re-put is a new generation.
type Invalidation struct {
	Key string
	Gen uint32
}

// InvalidationPoll is one WaitInvalidations request: the subscription (0
// for a new one), the last sequence number the subscriber applied, how
// many items it takes at most (0: MaxInvalidationItems) and how long to
// hold the answer when there is nothing to say (capped at TTL/3).
type InvalidationPoll struct {
	Sub, Ack uint64
	MaxItems int
	Wait     time.Duration
	// Unsubscribe ends subscription Sub: it is forgotten at once, and
	// barriers stop waiting for it.
	Unsubscribe bool
}

// InvalidationBatch answers a poll. Reset: drop everything cached (a new
// or unknown subscription, an overflowed queue, a bad ack); Last is then
// the sequence number to acknowledge. Otherwise Items are numbered First
// to Last (no items: Last is the last number sent, a heartbeat). More:
// items are waiting; ask again at once. TTL is the freshness the master
// grants: a subscriber serves cached values without the master only
// until TTL after it sent the poll of its last answer with More unset.
type InvalidationBatch struct {
	Sub         uint64
	Reset, More bool
	First, Last uint64
	Items       []Invalidation
	TTL         time.Duration
}

type invItem struct {
	seq uint64
	Invalidation
}

type subscriber struct {
	id    uint64
	q     []invItem // unacknowledged, by seq
	next  uint64    // the last seq assigned
	acked uint64
	lost  bool // overflowed or out of step: the next answer is a reset
	seen  time.Time
}

// invRegistry holds the master's invalidation subscribers. Its mutex is
// a leaf: publish runs under shard locks.
type invRegistry struct {
	n atomic.Int32 // len(subs), read without mu
	// hold (unix ns) is when a master that started with state (restored
	// from its log, promoted from a standby) stops holding barriers: the
	// caches of the master before it had no way to subscribe here and may
	// serve until InvalidationTTL after that master's last answer.
	hold atomic.Int64
	mu   sync.Mutex
	subs map[uint64]*subscriber
	wake chan struct{} // closed when an item is queued (polls wait on it)
	acks chan struct{} // closed when an ack arrives (barriers wait on it)
}

// signal closes *ch (waking its waiters) and makes a new one. Under mu.
func signal(ch *chan struct{}) {
	if *ch != nil {
		close(*ch)
	}
	*ch = make(chan struct{})
}

// drop forgets subscriber id. Under mu.
func (r *invRegistry) drop(id uint64) {
	delete(r.subs, id)
	r.n.Store(int32(len(r.subs)))
}

func (r *invRegistry) chans() (wake, acks chan struct{}) {
	if r.wake == nil {
		r.wake, r.acks = make(chan struct{}), make(chan struct{})
	}
	return r.wake, r.acks
}

// invalidated queues the invalidation of a complete object for every
// subscriber. Called where a complete object is forgotten (live, not on
// replay), under its shard lock.
func (m *Master) invalidated(key string, gen uint32) {
	r := &m.inval
	if r.n.Load() == 0 {
		return
	}
	key = strings.Clone(key) // the shard's key may live in an arena chunk that is reused
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.chans()
	for id, s := range r.subs {
		if now.Sub(s.seen) > 10*m.cfg.InvalidationTTL {
			r.drop(id) // silent: its queue would only fill
			continue
		}
		s.next++
		if s.lost {
			continue
		}
		if len(s.q) >= MaxInvalidationQueue {
			s.q, s.lost = nil, true
			continue
		}
		s.q = append(s.q, invItem{s.next, Invalidation{key, gen}})
	}
	signal(&r.wake)
}

// invBarrier returns once every subscriber has acknowledged the
// invalidations queued so far, or InvalidationTTL after the call: by
// then a subscriber that did not answer has stopped serving cached
// values on its own (its last answer without those items was composed
// before they were queued, so its freshness ran out). Destructive calls
// (removes) answer after it, and a put's end waits for it before it
// makes a new generation visible, so no reader sees a replaced value.
func (m *Master) invBarrier() {
	r := &m.inval
	if h := r.hold.Load(); h != 0 { // no clock read on the put path once the hold is over
		if d := time.Until(time.Unix(0, h)); d > 0 {
			time.Sleep(d)
		} else {
			r.hold.CompareAndSwap(h, 0)
		}
	}
	if r.n.Load() == 0 {
		return
	}
	r.mu.Lock()
	type target struct {
		s  *subscriber
		to uint64
	}
	var ts []target
	now := time.Now()
	for _, s := range r.subs {
		// One silent for a TTL sent its last poll longer ago than its
		// freshness lasts (0.9 TTL from sending): it serves nothing.
		if s.acked < s.next && now.Sub(s.seen) < m.cfg.InvalidationTTL {
			ts = append(ts, target{s, s.next})
		}
	}
	r.mu.Unlock()
	if len(ts) == 0 {
		return
	}
	timer := time.NewTimer(m.cfg.InvalidationTTL)
	defer timer.Stop()
	for {
		r.mu.Lock()
		_, acks := r.chans()
		ts = deleteTargets(ts, func(t target) bool { return r.subs[t.s.id] != t.s || t.s.acked >= t.to })
		r.mu.Unlock()
		if len(ts) == 0 {
			return
		}
		select {
		case <-acks:
		case <-timer.C:
			m.invTimeouts.Add(1)
			return
		}
	}
}

// holdInvalidations makes barriers wait until InvalidationTTL from now
// when the master holds any object or segment (Start calls it): then it
// was restored or promoted, and the previous master's subscribers, which
// know nothing of this one, may still serve cached values until then.
func (m *Master) holdInvalidations() {
	if keys, _ := m.counts(); keys == 0 && len(m.alloc.Segments()) == 0 {
		return
	}
	m.inval.hold.Store(time.Now().Add(m.cfg.InvalidationTTL).UnixNano())
}

func deleteTargets[T any](ts []T, done func(T) bool) []T {
	out := ts[:0]
	for _, t := range ts {
		if !done(t) {
			out = append(out, t)
		}
	}
	return out
}

// InvalidationTimeouts counts barriers that stopped waiting for a
// subscriber after InvalidationTTL.
func (m *Master) InvalidationTimeouts() uint64 { return m.invTimeouts.Load() }

// BarrierFree reports that no invalidation barrier can wait now: there is
// no subscriber and no hold after a restore. Puts and removes then wait
// on nothing but the master's own locks (and a blocking event sink), so a
// server may run them without a goroutine of their own.
func (m *Master) BarrierFree() bool {
	if m.inval.n.Load() != 0 {
		return false
	}
	h := m.inval.hold.Load()
	return h == 0 || time.Now().UnixNano() >= h
}

// Subscribers is the number of live invalidation subscriptions.
func (m *Master) Subscribers() int { return int(m.inval.n.Load()) }

// WaitInvalidations serves one poll of an invalidation subscription
// (see InvalidationBatch). It acknowledges p.Ack, then answers at once
// with the waiting items, or after at most p.Wait (capped at a third of
// InvalidationTTL) or when ctx ends with a heartbeat. A subscription not
// polled for 10 TTLs is dropped; at most MaxSubscribers exist.
func (m *Master) WaitInvalidations(ctx context.Context, p InvalidationPoll) (InvalidationBatch, error) {
	r := &m.inval
	ttl := m.cfg.InvalidationTTL
	maxItems := p.MaxItems
	if maxItems <= 0 || maxItems > MaxInvalidationItems {
		maxItems = MaxInvalidationItems
	}
	hold := min(max(p.Wait, 0), ttl/3)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.chans()
	s := r.subs[p.Sub]
	if p.Unsubscribe {
		if s != nil {
			r.drop(p.Sub)
			signal(&r.acks) // waiting barriers look again
		}
		return InvalidationBatch{TTL: ttl}, nil
	}
	if s == nil {
		for id, o := range r.subs { // drop the silent
			if now.Sub(o.seen) > 10*ttl {
				r.drop(id)
			}
		}
		if len(r.subs) >= m.cfg.MaxSubscribers {
			return InvalidationBatch{}, errcode.New(errcode.NoAvailableHandle, "invalidation subscribers: %d already", len(r.subs))
		}
		if r.subs == nil {
			r.subs = map[uint64]*subscriber{}
		}
		s = &subscriber{id: rand.Uint64() | 1, seen: now}
		for r.subs[s.id] != nil {
			s.id = rand.Uint64() | 1
		}
		r.subs[s.id] = s
		r.n.Store(int32(len(r.subs)))
		return InvalidationBatch{Sub: s.id, Reset: true, TTL: ttl}, nil
	}
	s.seen = now
	switch {
	case p.Ack > s.next:
		s.lost = true // acknowledges what was never sent
	case p.Ack > s.acked:
		i := 0
		for i < len(s.q) && s.q[i].seq <= p.Ack {
			i++
		}
		s.q = append(s.q[:0], s.q[i:]...)
		s.acked = p.Ack
		signal(&r.acks)
	}
	deadline := time.NewTimer(hold)
	defer deadline.Stop()
	for {
		if s.lost {
			s.q, s.lost = nil, false
			return InvalidationBatch{Sub: s.id, Reset: true, Last: s.next, TTL: ttl}, nil
		}
		if len(s.q) > 0 {
			b := InvalidationBatch{Sub: s.id, First: s.q[0].seq, TTL: ttl}
			size := 0
			for _, it := range s.q {
				if len(b.Items) == maxItems || len(b.Items) > 0 && size+len(it.Key) > MaxInvalidationBytes {
					b.More = true
					break
				}
				size += len(it.Key) + 8
				b.Items = append(b.Items, it.Invalidation)
				b.Last = it.seq
			}
			return b, nil
		}
		wake, _ := r.chans()
		r.mu.Unlock()
		select {
		case <-wake:
			r.mu.Lock()
			continue
		case <-deadline.C:
		case <-ctx.Done():
		}
		r.mu.Lock()
		if r.subs[s.id] != s {
			return InvalidationBatch{Sub: s.id, Reset: true, Last: s.next, TTL: ttl}, nil
		}
		if len(s.q) > 0 || s.lost {
			continue // queued as the wait ended
		}
		return InvalidationBatch{Sub: s.id, Last: s.next, TTL: ttl}, nil
	}
}
