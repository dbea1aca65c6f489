package master

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// ErrReplayDiverged is returned by Replay when a logged operation does not
// apply to the replica's state as it did on the master: a key missing or
// in the wrong state, a segment at another index, an address that
// differs. The replica's state is then unreliable; the caller must
// resynchronise it (e.g. from a snapshot).
var ErrReplayDiverged = errors.New("master: replay diverged")

// OpKind is the kind of a metadata change.
type OpKind uint8

// Operation kinds. Key operations carry Key; segment operations carry
// Segments[0] (the segment index) and, for Mount and UnmountStart,
// Segment.
const (
	// OpPutStart creates an unfinished object of Size bytes owned by
	// Client with replicas on Segments at Addrs (in replica order), with
	// the pins of SoftPin/SoftPinTTL/HardPin and put generation Gen; Time
	// is its start time.
	OpPutStart OpKind = iota + 1
	// OpPutEnd completes the object (Client must own it, and Gen, when
	// not 0, match its generation) at Time. Block is what the client
	// gave, for events.
	OpPutEnd
	// OpPutRevoke frees an unfinished object (Client must own it; Gen as
	// OpPutEnd).
	OpPutRevoke
	// OpRemove deletes an object (Remove, BatchRemove, RemoveByRegex,
	// RemoveAll: one op per key). A complete object's space is freed; an
	// unfinished one's is quarantined until its release time.
	OpRemove
	// OpEvict deletes a complete object and frees its space.
	OpEvict
	// OpDiscard deletes an unfinished object older than PutDiscardTimeout
	// (a new PutStart takes the key over) and quarantines its space.
	OpDiscard
	// OpDiscardFree frees a quarantined entry: Key and its replicas'
	// Segments and Addrs.
	OpDiscardFree
	// OpPutRelease frees an unfinished object older than
	// PutReleaseTimeout.
	OpPutRelease
	// OpDropReplica forgets the object's replica on segment Segments[0]
	// (which is being unmounted); an object left with none is erased.
	OpDropReplica
	// OpMount mounts *Segment at index Segments[0] for Client and starts
	// tracking the client.
	OpMount
	// OpUnmountStart stops placement on segment Segments[0].
	OpUnmountStart
	// OpUnmount releases segment Segments[0] after its replicas were
	// dropped, and forgets quarantined replicas on it.
	OpUnmount
	// OpClientExpired forgets Client (its segments are gone); its next
	// Ping gets NEED_REMOUNT.
	OpClientExpired
	// OpReserve places reservation ID (the master's next id) of Size
	// bytes for Client on Segments at Addrs, with pins as OpPutStart.
	OpReserve
	// OpCommit binds reservation ID (Client's) to Key and completes the
	// object at Time; Block as OpPutEnd.
	OpCommit
	// OpUnreserve frees reservation ID: given back by Client, or (zero
	// Client) older than PutReleaseTimeout.
	OpUnreserve
	// OpDropReserved forgets reservation ID's replica on segment
	// Segments[0] (being unmounted); one left with none is forgotten.
	OpDropReserved
	// OpClientLeft forgets Client after UnmountSegment took its last
	// segment: a clean departure, not an expiry.
	OpClientLeft
)

var opNames = [...]string{"", "PutStart", "PutEnd", "PutRevoke", "Remove", "Evict", "Discard", "DiscardFree",
	"PutRelease", "DropReplica", "Mount", "UnmountStart", "Unmount", "ClientExpired",
	"Reserve", "Commit", "Unreserve", "DropReserved", "ClientLeft"}

func (k OpKind) String() string {
	if int(k) < len(opNames) && k != 0 {
		return opNames[k]
	}
	return fmt.Sprintf("OpKind(%d)", k)
}

// Op is one metadata change, as logged. Leases, soft-pin renewals and
// client heartbeats are soft state and never logged.
type Op struct {
	Kind       OpKind
	Time       int64 // unix nanoseconds on the master's clock
	Key        string
	Client     UUID
	Size       uint64
	SoftPin    bool
	SoftPinTTL time.Duration // 0 = default
	HardPin    bool
	Segments   []uint32
	Addrs      []uint64
	Segment    *alloc.Segment
	Block      *BlockMeta
	ID         uint64 // reservation id
	// Gen is OpPutStart's put generation; on OpPutEnd and OpPutRevoke the
	// one the writer gave (0: not checked).
	Gen uint64
	// HoldUntil (unix ns), on an OpRemove of a complete object whose
	// read lease had not ended: its space is quarantined until then, as
	// readers may still read it within their lease. Set by apply.
	HoldUntil int64
}

// OpSink receives every metadata change. Append is called while the
// master holds the locks of everything the op touches (the key's shard,
// the segments whose allocators it changes, the segment table), so the
// order of Append calls is a valid serialisation: replaying the ops in
// that order on a fresh master reproduces the state, addresses included.
// Append must not block for long and must not call back into the Master;
// the op is the sink's to keep.
type OpSink interface {
	Append(op *Op)
}

// applyArgs carries what apply needs beyond the op.
type applyArgs struct {
	replay  bool
	quiet   bool    // no per-key events (RemoveAll emits one Cleared)
	obj     *object // out: the object PutStart created
	unmount bool    // replicas dropped by a clean UnmountSegment, not an expiry (counters)
	// minReps: a live PutStart or Reserve placing fewer replicas (at
	// least one) fails and places none.
	minReps int
	rs      *resvShard // the locked reservation table of a reservation op
	// scratch, when not nil, lends a batch's buffers to place.
	scratch *placeScratch
	// found, when not nil, is the key's record the live caller already
	// looked up under the shard lock (a second lookup costs a cache miss).
	found *object
}

// placeScratch holds a batch's buffers for place: addrs is carved into
// the ops' Addrs (the sink keeps them); ps is reused by every item.
type placeScratch struct {
	addrs []uint64
	ps    []alloc.Placement
}

func (m *Master) append(op *Op, a *applyArgs) {
	if m.oplog != nil && !a.replay {
		m.oplog.Append(op)
	}
}

func diverged(op *Op, format string, args ...any) error {
	return fmt.Errorf("%w: %v %q: %s", ErrReplayDiverged, op.Kind, op.Key, fmt.Sprintf(format, args...))
}

// apply is the one place metadata changes. The caller holds the key's
// shard lock for key operations (sh), segMu for segment and client
// operations, the owner's reservation table (a.rs) for reservation
// operations (and the shard lock too for OpCommit), nothing for OpDiscardFree. Live callers have checked the
// preconditions; on replay apply checks them and reports divergence.
func (m *Master) apply(sh *shard, h uint64, op *Op, a *applyArgs) error {
	switch op.Kind {
	case OpPutStart:
		return m.applyPutStart(sh, h, op, a)
	case OpPutEnd:
		return m.applyPutEnd(sh, h, op, a)
	case OpPutRevoke, OpRemove, OpEvict, OpDiscard, OpPutRelease:
		return m.applyDelete(sh, h, op, a)
	case OpDropReplica:
		return m.applyDropReplica(sh, h, op, a)
	case OpDiscardFree:
		return m.applyDiscardFree(op, a)
	case OpMount:
		return m.applyMount(op, a)
	case OpUnmountStart:
		return m.applyUnmountStart(op, a)
	case OpUnmount:
		return m.applyUnmount(op, a)
	case OpClientExpired, OpClientLeft:
		return m.applyClientExpired(op, a)
	case OpReserve:
		return m.applyReserve(op, a)
	case OpCommit:
		return m.applyCommit(sh, h, op, a)
	case OpUnreserve:
		return m.applyUnreserve(op, a)
	case OpDropReserved:
		return m.applyDropReserved(op, a)
	}
	return fmt.Errorf("%w: unknown op kind %v", ErrReplayDiverged, op.Kind)
}

func (m *Master) applyPutStart(sh *shard, h uint64, op *Op, a *applyArgs) error {
	if a.replay {
		// A live caller claimed the key (claimKey) under the same lock.
		if sh.get(op.Key, h) != nil {
			return diverged(op, "key exists")
		}
		// A promoted standby goes on from the last generation logged.
		for g := m.putGen.Load(); g < op.Gen; g = m.putGen.Load() {
			if m.putGen.CompareAndSwap(g, op.Gen) {
				break
			}
		}
	}
	return m.place(op, a, nil, func(o object) {
		sh.insert(op.Key, h, o)
		sh.pending++
		if o.has(fSoftPin) {
			m.softPinned.Add(1)
		}
		if o.has(fHardPin) {
			m.hardPinned.Add(1)
		}
	})
}

// place allocates the replicas of a PutStart or Reserve (reproducing the
// logged ones on replay) and logs op under the allocator's locks, so the
// log orders it with every other change on those segments; then hands
// the new unfinished object to insert. prepare, when not nil, runs just
// before op is logged. The caller's lock (shard or reservation table)
// keeps the object out of sight until insert: an unmount that begins
// after the allocation scans under that lock and finds it. The segment
// locks are not held across the object's record and index writes (their
// cache misses): every put of one segment queues on them.
func (m *Master) place(op *Op, a *applyArgs, prepare func(), insert func(object)) error {
	if a.replay && len(op.Segments) != len(op.Addrs) {
		return diverged(op, "%d segments, %d addresses", len(op.Segments), len(op.Addrs))
	}
	var bad error
	var dst []alloc.Placement
	if a.scratch != nil {
		dst = a.scratch.ps
	}
	ps := m.alloc.AllocateSetInto(dst, op.Segments, op.Size, func(ps []alloc.Placement) {
		if bad = m.placed(op, ps, a); bad != nil || len(ps) == 0 {
			return
		}
		if least := max(a.minReps, 1); !a.replay && len(ps) < least {
			bad = errcode.New(errcode.NoAvailableHandle, "%d replicas required, only %d placed for %d bytes", least, len(ps), op.Size)
			return
		}
		if prepare != nil {
			prepare()
		}
		m.append(op, a)
	})
	if bad != nil {
		if err := m.alloc.FreeSet(ps, op.Size, nil); err != nil {
			return fmt.Errorf("%w (undo: %v)", bad, err)
		}
		return bad
	}
	if len(ps) == 0 {
		return errcode.New(errcode.NoAvailableHandle, "no segment could hold %d bytes", op.Size)
	}
	o := m.pendingObject(op, ps)
	insert(o)
	if a.obj != nil {
		*a.obj = o
	}
	return nil
}

// placed checks (replay) or records (live) where AllocateSet put the
// replicas of a PutStart or Reserve.
func (m *Master) placed(op *Op, ps []alloc.Placement, a *applyArgs) error {
	if a.replay {
		if len(ps) != len(op.Segments) {
			return diverged(op, "placed %d of %d replicas", len(ps), len(op.Segments))
		}
		for i, p := range ps {
			if p.Seg != op.Segments[i] || p.Addr != op.Addrs[i] {
				return diverged(op, "replica %d at %d:%#x, logged %d:%#x", i, p.Seg, p.Addr, op.Segments[i], op.Addrs[i])
			}
		}
		return nil
	}
	if len(ps) == 0 {
		return nil
	}
	op.Segments = op.Segments[:0]
	if sc := a.scratch; sc != nil && cap(sc.addrs)-len(sc.addrs) >= len(ps) {
		n := len(sc.addrs)
		op.Addrs = sc.addrs[n : n : n+len(ps)]
		sc.addrs = sc.addrs[:n+len(ps)]
	} else {
		op.Addrs = make([]uint64, 0, len(ps))
	}
	for _, p := range ps {
		op.Segments = append(op.Segments, p.Seg)
		op.Addrs = append(op.Addrs, p.Addr)
	}
	return nil
}

// extPool recycles the ext of a put that PutEnd completes: one record
// per unfinished put was half of the master's allocations.
var extPool = sync.Pool{New: func() any { return new(objExt) }}

// pendingObject is the unfinished object a PutStart or Reserve creates.
func (m *Master) pendingObject(op *Op, ps []alloc.Placement) object {
	o := newObject(op.Size, op.Time, ps[0], uint32(op.Gen))
	o.ext = extPool.Get().(*objExt)
	*o.ext = objExt{owner: op.Client, pinTTL: int64(op.SoftPinTTL)}
	if len(ps) > 1 {
		o.ext.more = slices.Clone(ps[1:])
	}
	if op.SoftPin {
		o.set(fSoftPin)
	}
	if op.HardPin {
		o.set(fHardPin)
	}
	return o
}

// complete makes an unfinished object COMPLETE at op.Time (PutEnd,
// Commit).
func (m *Master) complete(o *object, op *Op) {
	o.set(fComplete)
	o.lease = op.Time
	if o.has(fSoftPin) {
		o.setPin(op.Time + m.softPinTTL(o))
	}
	o.ext.owner = UUID{}
	if m.ev != nil && op.Block != nil && len(op.Block.BlockHashes) > 0 {
		o.ext.hashes = slices.Clone(op.Block.BlockHashes)
	}
	o.trimExt()
}

func (m *Master) applyPutEnd(sh *shard, h uint64, op *Op, a *applyArgs) error {
	o := a.found
	if o == nil {
		o = sh.get(op.Key, h)
	}
	if o == nil || o.complete() || o.owner() != op.Client || !o.isGen(op.Gen) {
		return diverged(op, "no unfinished put of this client and generation")
	}
	e := o.ext
	m.complete(o, op)
	if o.ext == nil {
		// Only the record held it (every copy of a record is made and
		// dropped under the shard's lock, or, in Snapshot, loses its ext
		// pointer before the lock is released).
		*e = objExt{}
		extPool.Put(e)
	}
	sh.pending--
	m.append(op, a)
	if m.ev != nil && !a.replay {
		m.emit(a, &Event{Kind: EventStored, Key: op.Key, Size: o.size(), Replicas: m.replicas(o), Block: op.Block})
	}
	return nil
}

// applyDelete removes an object: PutRevoke, Remove, Evict, Discard,
// PutRelease.
func (m *Master) applyDelete(sh *shard, h uint64, op *Op, a *applyArgs) error {
	p := a.found
	if p == nil {
		p = sh.get(op.Key, h)
	}
	if p == nil {
		return diverged(op, "no such key")
	}
	o := *p // the slot is cleared below
	switch op.Kind {
	case OpPutRevoke:
		if o.complete() || o.owner() != op.Client || !o.isGen(op.Gen) {
			return diverged(op, "no unfinished put of this client and generation")
		}
	case OpEvict:
		if !o.complete() {
			return diverged(op, "evicting an unfinished put")
		}
	case OpDiscard, OpPutRelease:
		if o.complete() {
			return diverged(op, "object is complete")
		}
	}
	ps := o.placements()
	if op.Kind == OpRemove && o.complete() && !a.replay && o.leased(op.Time) {
		op.HoldUntil = o.lease // a forced remove: readers hold leases
	}
	commit := func() {
		m.forget(sh, h, op.Key, &o)
		m.append(op, a)
		if o.complete() && !a.replay {
			m.invalidated(op.Key, o.gen)
		}
		if o.complete() && m.ev != nil && !a.replay {
			reason := ReasonRemoved
			if op.Kind == OpEvict {
				reason = ReasonEvicted
			}
			m.emit(a, m.removedEvent(op.Key, &o, reason))
		}
	}
	// An unfinished put's writer may still be writing: quarantine its
	// space until the put's release time instead of reusing it now; a
	// leased object's readers may still read: until its lease ends.
	if op.Kind == OpDiscard || op.Kind == OpRemove && (!o.complete() || op.HoldUntil > 0) {
		releaseAt := o.lease + int64(m.cfg.PutReleaseTimeout)
		if o.complete() {
			releaseAt = op.HoldUntil
		}
		m.discardMu.Lock()
		m.discarded = append(m.discarded, quarantined{key: op.Key, ps: ps, size: o.size(),
			releaseAt: releaseAt})
		m.quarantinedN.Add(int64(len(ps)))
		commit()
		m.discardMu.Unlock()
		return nil
	}
	if err := m.alloc.FreeSet(ps, o.size(), commit); err != nil {
		return fmt.Errorf("master: %v %q: freeing replicas: %w", op.Kind, op.Key, err)
	}
	return nil
}

// forget deletes the object from its shard and the counters.
func (m *Master) forget(sh *shard, h uint64, key string, o *object) {
	sh.remove(key, h)
	if !o.complete() {
		sh.pending--
	}
	if o.has(fSoftPin) {
		m.softPinned.Add(-1)
	}
	if o.has(fHardPin) {
		m.hardPinned.Add(-1)
	}
}

func (m *Master) removedEvent(key string, o *object, reason RemoveReason) *Event {
	e := &Event{Kind: EventRemoved, Reason: reason, Key: key, Size: o.size(), Replicas: m.replicas(o)}
	if o.ext != nil && o.ext.hashes != nil {
		e.Block = &BlockMeta{BlockHashes: o.ext.hashes}
	}
	return e
}

func (m *Master) applyDropReplica(sh *shard, h uint64, op *Op, a *applyArgs) error {
	p := sh.get(op.Key, h)
	if p == nil || len(op.Segments) != 1 {
		return diverged(op, "no such key")
	}
	o := *p
	seg := op.Segments[0]
	ps := o.placements()
	i := slices.IndexFunc(ps, func(p alloc.Placement) bool { return p.Seg == seg })
	if i < 0 {
		return diverged(op, "no replica on segment %d", seg)
	}
	m.countDropped(a, len(ps) == 1)
	if len(ps) == 1 {
		// The last replica: the object is lost. Its space went with the
		// segment, so nothing is freed.
		m.forget(sh, h, op.Key, &o)
		m.append(op, a)
		if o.complete() && !a.replay {
			m.invalidated(op.Key, o.gen)
		}
		if o.complete() && m.ev != nil && !a.replay {
			m.emit(a, m.removedEvent(op.Key, &o, ReasonLost))
		}
		return nil
	}
	o.setPlacements(slices.Delete(ps, i, i+1))
	*p = o
	m.append(op, a)
	if o.complete() && !a.replay {
		// Location caches may name the dropped replica, whose memory
		// left the pool with its segment.
		m.invalidated(op.Key, o.gen)
	}
	return nil
}

// countDropped counts a replica dropped with its segment, and the object
// when it was the last one: as lost on expiry (or replay), as unmounted
// on a clean UnmountSegment.
func (m *Master) countDropped(a *applyArgs, last bool) {
	rep, obj := &m.droppedReplicas, &m.lostKeys
	if a.unmount {
		rep, obj = &m.unmountedReplicas, &m.unmountedKeys
	}
	rep.Add(1)
	if last {
		obj.Add(1)
	}
}

func (m *Master) applyDiscardFree(op *Op, a *applyArgs) error {
	m.discardMu.Lock()
	defer m.discardMu.Unlock()
	i := slices.IndexFunc(m.discarded, func(q quarantined) bool {
		return q.key == op.Key && len(op.Addrs) == len(q.ps) && len(q.ps) > 0 &&
			q.ps[0].Addr == op.Addrs[0] && q.ps[0].Seg == op.Segments[0]
	})
	if i < 0 {
		return diverged(op, "no such quarantined replicas")
	}
	return m.freeQuarantined(i, op, a)
}

// freeQuarantined frees entry i. discardMu is held.
func (m *Master) freeQuarantined(i int, op *Op, a *applyArgs) error {
	q := m.discarded[i]
	m.discarded = slices.Delete(m.discarded, i, i+1)
	m.quarantinedN.Add(-int64(len(q.ps)))
	return m.alloc.FreeSet(q.ps, q.size, func() { m.append(op, a) })
}

func (m *Master) applyMount(op *Op, a *applyArgs) error {
	if op.Segment == nil || a.replay && len(op.Segments) != 1 {
		return diverged(op, "mount without a segment")
	}
	s := *op.Segment
	_, err := m.alloc.Mount(s, func(idx uint32) error {
		if a.replay {
			if idx != op.Segments[0] {
				return diverged(op, "segment %v at index %d, logged %d", s.ID, idx, op.Segments[0])
			}
		} else {
			op.Segments = []uint32{idx}
		}
		m.clientMu.Lock()
		c := m.clients[s.Client]
		if c == nil {
			c = &client{}
			m.clients[s.Client] = c
		}
		c.lastSeen.Store(m.now())
		m.clientMu.Unlock()
		m.append(op, a)
		return nil
	})
	if a.replay && err != nil && !errors.Is(err, ErrReplayDiverged) {
		return diverged(op, "%v", err)
	}
	return err
}

func (m *Master) applyUnmountStart(op *Op, a *applyArgs) error {
	if op.Segment == nil {
		return diverged(op, "unmount without a segment")
	}
	if a.replay && len(op.Segments) != 1 {
		return diverged(op, "unmount without a segment index")
	}
	idx, err := m.alloc.Unmount(op.Segment.ID, func(idx uint32) {
		if !a.replay {
			op.Segments = []uint32{idx}
		}
		m.append(op, a)
	})
	switch {
	case a.replay && err != nil:
		return diverged(op, "%v", err)
	case a.replay && idx != op.Segments[0]:
		return diverged(op, "segment at index %d, logged %d", idx, op.Segments[0])
	}
	return err
}

func (m *Master) applyUnmount(op *Op, a *applyArgs) error {
	if len(op.Segments) != 1 {
		return diverged(op, "unmount without a segment")
	}
	idx := op.Segments[0]
	err := m.alloc.Release(idx, func() {
		// Quarantined replicas there went with the segment.
		m.discardMu.Lock()
		kept := m.discarded[:0]
		for _, q := range m.discarded {
			n := len(q.ps)
			q.ps = slices.DeleteFunc(q.ps, func(p alloc.Placement) bool { return p.Seg == idx })
			m.quarantinedN.Add(int64(len(q.ps) - n))
			if len(q.ps) > 0 {
				kept = append(kept, q)
			}
		}
		clear(m.discarded[len(kept):])
		m.discarded = kept
		m.append(op, a)
		m.discardMu.Unlock()
	})
	if a.replay && err != nil {
		return diverged(op, "%v", err)
	}
	return err
}

func (m *Master) applyClientExpired(op *Op, a *applyArgs) error {
	m.clientMu.Lock()
	_, ok := m.clients[op.Client]
	delete(m.clients, op.Client)
	m.clientMu.Unlock()
	if !ok && a.replay {
		return diverged(op, "unknown client %v", op.Client)
	}
	m.append(op, a)
	return nil
}

// Replay applies an op logged by another master (a standby following the
// leader's log). Ops must come in log order. Replay neither logs nor emits
// events; leases and client heartbeats start fresh. A mismatch with the
// logged result (ErrReplayDiverged) leaves the op unapplied.
func (m *Master) Replay(op *Op) error {
	if op == nil {
		return fmt.Errorf("%w: nil op", ErrReplayDiverged)
	}
	a := &applyArgs{replay: true}
	switch op.Kind {
	case OpPutStart, OpPutEnd, OpPutRevoke, OpRemove, OpEvict, OpDiscard, OpPutRelease, OpDropReplica:
		sh, h := m.locate(op.Key)
		sh.mu.Lock()
		defer sh.unlock()
		return m.apply(sh, h, op, a)
	case OpMount, OpUnmountStart, OpUnmount, OpClientExpired, OpClientLeft:
		m.segMu.Lock()
		defer m.segMu.Unlock()
		return m.apply(nil, 0, op, a)
	case OpCommit:
		sh, h := m.locate(op.Key)
		sh.mu.Lock()
		defer sh.unlock()
		a.rs = m.resvOf(op.Client)
		a.rs.mu.Lock()
		defer a.rs.mu.Unlock()
		return m.apply(sh, h, op, a)
	case OpReserve, OpUnreserve, OpDropReserved:
		// Release and unmount log no client: find the id's table.
		a.rs = m.resvOf(op.Client)
		if op.Kind != OpReserve && op.Client.IsZero() {
			if rs := m.resvHolding(op.ID); rs != nil {
				a.rs = rs
			}
		}
		a.rs.mu.Lock()
		defer a.rs.mu.Unlock()
		return m.apply(nil, 0, op, a)
	}
	return m.apply(nil, 0, op, a)
}
