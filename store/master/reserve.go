package master

import (
	"slices"
	"sync"
	"time"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// Reservations make a put one round trip instead of two (PutStart, then
// PutEnd). Reserve places space for a future put of a given size, as
// PutStart would but under no key; the client writes a value there and
// Commit binds the space to a key and completes the object in one step.
// A client keeps a few reservations per value size it puts often and asks
// for a replacement in each Commit.
//
// A reservation is an unfinished object owned by its client, kept in a
// table of its own: it counts as used space, is never evicted, loses its
// replicas with their segment like an unfinished put, may be committed
// until PutDiscardTimeout after it was placed, and is freed at
// PutReleaseTimeout if nobody gave it back (Unreserve) by then.

// resvShards is the number of reservation tables. A reservation lives in
// its owner's (resvOf), so Reserve, Commit and Unreserve take one table's
// lock and clients hashed to different tables do not wait on each other
// (BenchmarkReserveCommit16).
const resvShards = 64

type resvShard struct {
	mu sync.Mutex
	m  map[uint64]object
	_  [48]byte // a cache line each
}

func (m *Master) resvOf(client UUID) *resvShard {
	h := (client.Hi ^ client.Lo*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9
	return &m.resv[(h>>32)%uint64(len(m.resv))]
}

// resvHolding returns the table holding reservation id, or nil; it
// takes the tables' locks one at a time, none held after.
func (m *Master) resvHolding(id uint64) *resvShard {
	for i := range m.resv {
		rs := &m.resv[i]
		rs.mu.Lock()
		_, ok := rs.m[id]
		rs.mu.Unlock()
		if ok {
			return rs
		}
	}
	return nil
}

// MaxReserveCount bounds the reservations one spec may ask for.
const MaxReserveCount = 64

// Reservation is space placed for one put of exactly Size bytes.
type Reservation struct {
	ID       uint64
	Size     uint64
	Replicas []Replica // status PROCESSING
}

// ReserveSpec asks for Count reservations of Size bytes placed by Config.
type ReserveSpec struct {
	Size   uint64
	Config ReplicateConfig
	Count  int
}

// ReserveResult answers one spec: the reservations placed, or the error
// that stopped the first one.
type ReserveResult struct {
	Reservations []Reservation
	Err          error
}

// CommitItem binds reservation ID to Key; Block goes to the Stored event.
type CommitItem struct {
	Key   string
	ID    uint64
	Block *BlockMeta
}

// Reserve places up to spec.Count reservations for client. Placement
// stops at the first failure; when none was placed the error says why
// (ErrNoAvailableHandle when no segment has room). Unlike PutStart it
// never evicts: reservations are speculative and must not push out data.
func (m *Master) Reserve(client UUID, spec ReserveSpec) ReserveResult {
	switch {
	case client.IsZero():
		return ReserveResult{Err: errcode.New(errcode.InvalidParams, "client id is zero")}
	case spec.Size == 0:
		return ReserveResult{Err: errcode.New(errcode.InvalidParams, "size 0")}
	case spec.Count < 1 || spec.Count > MaxReserveCount:
		return ReserveResult{Err: errcode.New(errcode.InvalidParams, "count %d outside [1, %d]", spec.Count, MaxReserveCount)}
	}
	rc := spec.Config
	n, err := m.checkConfig(&rc)
	if err != nil {
		return ReserveResult{Err: err}
	}
	req := alloc.Request{Size: spec.Size, Replicas: n, Preferred: rc.Preferred, Local: client, SameNode: rc.SameNode,
		MinReplicas: rc.MinReplicas, NoSuspect: true} // speculative: never on a segment that failed writes
	var res ReserveResult
	now := m.now() // one clock read for the count
	ops, one := m.batchOps(spec.Count)
	var buf []Replica // every reservation's replicas, carved one by one
	var sc *batchScratch
	if spec.Count > 1 {
		sc = newBatchScratch(spec.Count, n)
	}
	for i := range spec.Count {
		req.Into = nil
		if sc != nil && cap(sc.segs)-len(sc.segs) >= n {
			k := len(sc.segs)
			req.Into, sc.segs = sc.segs[k:k:k+n], sc.segs[:k+n]
		}
		segs, err := m.alloc.Choose(req)
		if err == nil {
			op := one
			if ops != nil {
				op = &ops[i]
			}
			*op = Op{Kind: OpReserve, Time: now, Client: client, Size: spec.Size, SoftPin: rc.SoftPin,
				SoftPinTTL: m.pinTTL(&rc), HardPin: rc.HardPin, Segments: segs}
			var o object
			rs := m.resvOf(client)
			rs.mu.Lock()
			a := &applyArgs{obj: &o, minReps: rc.MinReplicas, rs: rs}
			if sc != nil {
				a.scratch = &sc.place
			}
			err = m.apply(nil, 0, op, a)
			var reps []Replica
			if err == nil {
				// Under the table's lock: an unmount's DropReserved
				// rewrites the placements o shares with the table.
				if buf == nil {
					buf = make([]Replica, 0, spec.Count*n)
				}
				start := len(buf)
				buf = m.appendReplicas(buf, &o)
				reps = slices.Clip(buf[start:])
			}
			rs.mu.Unlock()
			if err == nil {
				if res.Reservations == nil {
					res.Reservations = make([]Reservation, 0, spec.Count)
				}
				res.Reservations = append(res.Reservations, Reservation{ID: op.ID, Size: spec.Size, Replicas: reps})
				continue
			}
		}
		if len(res.Reservations) == 0 {
			res.Err = err
		}
		break
	}
	return res
}

// Commit binds reservations to keys and completes the objects, answering
// per item: ErrReplicaIsGone for a reservation that does not exist (given
// back, freed, lost with its segment) or is older than
// PutDiscardTimeout; ErrIllegalClient for another client's. A key that is
// stored, or being stored by a put younger than PutDiscardTimeout, is
// ErrObjectAlreadyExists and the reservation stays the client's to use
// again; an older unfinished put is taken over as PutStart does.
func (m *Master) Commit(client UUID, items []CommitItem) []error {
	m.invBarrier() // as PutEnd: caches drop an old generation first
	out := make([]error, len(items))
	now := m.now() // one clock read for the batch
	ops, one := m.batchOps(len(items))
	for i, it := range items {
		op := one
		if ops != nil {
			op = &ops[i]
		}
		out[i] = m.commit(client, it, now, op)
	}
	return out
}

// commit is one item of Commit, recorded in op.
func (m *Master) commit(client UUID, it CommitItem, now int64, op *Op) error {
	if err := m.checkKey(it.Key); err != nil {
		return err
	}
	defer m.flushEvents() // after the unlocks
	sh, h := m.locate(it.Key)
	sh.mu.Lock()
	defer sh.unlock()
	rs := m.resvOf(client)
	rs.mu.Lock()
	// Check the reservation before the key: a stale one must not take an
	// old put's key over.
	r, ok := rs.m[it.ID]
	if !ok {
		rs.mu.Unlock() // one table at a time
		if m.resvHolding(it.ID) != nil {
			return errcode.New(errcode.IllegalClient, "reservation %d belongs to another client", it.ID)
		}
		return errcode.New(errcode.ReplicaIsGone, "reservation %d does not exist", it.ID)
	}
	defer rs.mu.Unlock()
	switch {
	case r.owner() != client:
		return errcode.New(errcode.IllegalClient, "reservation %d belongs to another client", it.ID)
	case now-r.lease >= int64(m.cfg.PutDiscardTimeout):
		return errcode.New(errcode.ReplicaIsGone, "reservation %d expired", it.ID)
	}
	if err := m.claimKey(sh, h, it.Key, now); err != nil {
		return err
	}
	*op = Op{Kind: OpCommit, Time: now, Key: it.Key, Client: client, ID: it.ID, Block: it.Block}
	if err := m.apply(sh, h, op, &applyArgs{rs: rs}); err != nil {
		return err
	}
	if m.debugOn() {
		m.logPut(it.Key, sh.get(it.Key, h), client)
	}
	return nil
}

// Unreserve gives reservations back: their space is free at once (the
// client promises it is not writing there). Unknown ids and other
// clients' reservations are skipped; the count freed is returned.
func (m *Master) Unreserve(client UUID, ids []uint64) int {
	n := 0
	rs := m.resvOf(client)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, id := range ids {
		if r, ok := rs.m[id]; ok && r.owner() == client {
			if err := m.apply(nil, 0, &Op{Kind: OpUnreserve, Time: m.now(), Client: client, ID: id}, &applyArgs{rs: rs}); err != nil {
				m.cfg.Logger.Error("master: giving a reservation back", "id", id, "err", err)
				continue
			}
			n++
		}
	}
	return n
}

// pinTTL is the soft-pin TTL to record: zero for the default.
func (m *Master) pinTTL(rc *ReplicateConfig) time.Duration {
	if !rc.SoftPin || rc.SoftPinTTL == m.cfg.SoftPinTTL {
		return 0
	}
	return rc.SoftPinTTL
}

// dropReserved forgets reservation replicas on segment idx (being
// unmounted; clean says by UnmountSegment); segMu is held. It takes the
// tables one at a time: no new reservation is placed on an unmounting
// segment, so each table is clean once done.
func (m *Master) dropReserved(idx uint32, clean bool) error {
	var ids []uint64
	for i := range m.resv {
		rs := &m.resv[i]
		rs.mu.Lock()
		ids = ids[:0]
		for id, r := range rs.m {
			if slices.ContainsFunc(r.placements(), func(p alloc.Placement) bool { return p.Seg == idx }) {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids) // a deterministic log
		for _, id := range ids {
			if err := m.apply(nil, 0, &Op{Kind: OpDropReserved, Time: m.now(), ID: id, Segments: []uint32{idx}}, &applyArgs{unmount: clean, rs: rs}); err != nil {
				rs.mu.Unlock()
				return err
			}
		}
		rs.mu.Unlock()
	}
	return nil
}

// releaseStaleReserved frees reservations older than PutReleaseTimeout.
func (m *Master) releaseStaleReserved(now int64) {
	var ids []uint64
	for i := range m.resv {
		rs := &m.resv[i]
		rs.mu.Lock()
		ids = ids[:0]
		for id, r := range rs.m {
			if now-r.lease >= int64(m.cfg.PutReleaseTimeout) {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, id := range ids {
			m.releasedPuts.Add(1)
			if err := m.apply(nil, 0, &Op{Kind: OpUnreserve, Time: now, ID: id}, &applyArgs{rs: rs}); err != nil {
				m.cfg.Logger.Error("master: releasing a stale reservation", "id", id, "err", err)
			}
		}
		rs.mu.Unlock()
	}
}

func (m *Master) reservations() int {
	n := 0
	for i := range m.resv {
		rs := &m.resv[i]
		rs.mu.Lock()
		n += len(rs.m)
		rs.mu.Unlock()
	}
	return n
}

// Reservations lists the reservations in force (for admin and tests).
func (m *Master) Reservations() []Reservation {
	var out []Reservation
	for i := range m.resv {
		rs := &m.resv[i]
		rs.mu.Lock()
		for id, r := range rs.m {
			out = append(out, Reservation{ID: id, Size: r.size(), Replicas: m.replicas(&r)})
		}
		rs.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Reservation) int { return cmpU64(a.ID, b.ID) })
	return out
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// The apply functions below run with the lock of a.rs held, the table of
// the reservation's owner (and, for OpCommit, the key's shard lock).

func (m *Master) applyReserve(op *Op, a *applyArgs) error {
	if a.replay {
		if _, ok := a.rs.m[op.ID]; ok || op.ID == 0 {
			return diverged(op, "reservation %d exists", op.ID)
		}
	}
	return m.place(op, a, func() {
		if a.replay {
			for n := m.resvNext.Load(); n < op.ID && !m.resvNext.CompareAndSwap(n, op.ID); n = m.resvNext.Load() {
			}
		} else {
			op.ID = m.resvNext.Add(1)
		}
	}, func(o object) {
		a.rs.m[op.ID] = o
		m.reservedBytes.Add(int64(op.Size))
	})
}

func (m *Master) applyCommit(sh *shard, h uint64, op *Op, a *applyArgs) error {
	r, ok := a.rs.m[op.ID]
	switch {
	case !ok || r.owner() != op.Client:
		return diverged(op, "no reservation %d of this client", op.ID)
	case sh.get(op.Key, h) != nil:
		return diverged(op, "key exists")
	}
	delete(a.rs.m, op.ID)
	m.reservedBytes.Add(-int64(r.size()))
	if r.flags&fSoftPin != 0 {
		m.softPinned.Add(1)
	}
	if r.flags&fHardPin != 0 {
		m.hardPinned.Add(1)
	}
	m.complete(&r, op)
	sh.insert(op.Key, h, r)
	m.append(op, a)
	if m.ev != nil && !a.replay {
		m.emit(a, &Event{Kind: EventStored, Key: op.Key, Size: r.size(), Replicas: m.replicas(&r), Block: op.Block})
	}
	return nil
}

func (m *Master) applyUnreserve(op *Op, a *applyArgs) error {
	r, ok := a.rs.m[op.ID]
	if !ok || !op.Client.IsZero() && r.owner() != op.Client {
		return diverged(op, "no reservation %d of this client", op.ID)
	}
	return m.alloc.FreeSet(r.placements(), r.size(), func() {
		delete(a.rs.m, op.ID)
		m.reservedBytes.Add(-int64(r.size()))
		m.append(op, a)
	})
}

func (m *Master) applyDropReserved(op *Op, a *applyArgs) error {
	r, ok := a.rs.m[op.ID]
	if !ok || len(op.Segments) != 1 {
		return diverged(op, "no reservation %d", op.ID)
	}
	ps := r.placements()
	i := slices.IndexFunc(ps, func(p alloc.Placement) bool { return p.Seg == op.Segments[0] })
	if i < 0 {
		return diverged(op, "no replica on segment %d", op.Segments[0])
	}
	m.countDropped(a, false)
	if len(ps) == 1 {
		// Its only space went with the segment.
		delete(a.rs.m, op.ID)
		m.reservedBytes.Add(-int64(r.size()))
	} else {
		r.setPlacements(slices.Delete(ps, i, i+1))
		a.rs.m[op.ID] = r
	}
	m.append(op, a)
	return nil
}
