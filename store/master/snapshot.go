package master

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/crescent-kv/crescent/store/alloc"
)

// RecordKind is the kind of a snapshot record.
type RecordKind uint8

// Record kinds, in the order Export writes them. Values never change.
const (
	// RecordTable comes first: the put generation, the last reservation
	// id and the segment table (its length, released indices, the
	// mounted ones in mount order).
	RecordTable RecordKind = iota + 1
	// RecordSegment is a mounted segment (Index, Segment, Unmounting).
	RecordSegment
	// RecordRanges is a run of a segment's ranges in address order
	// (Index, Ranges); a segment's runs follow its RecordSegment.
	RecordRanges
	// RecordClient is a tracked client (Client).
	RecordClient
	// RecordObject is an object (Key and the object fields).
	RecordObject
	// RecordReservation is a reservation (ID and the object fields).
	RecordReservation
	// RecordQuarantined is a quarantined entry (Key, Size, Release,
	// Segs, Addrs).
	RecordQuarantined
)

// MaxRangesPerRecord bounds a RecordRanges run, so records stay small.
const MaxRangesPerRecord = 16384

// Record is one piece of the master's replicated state, as Export writes
// it and Import reads it. Which fields are set depends on Kind.
type Record struct {
	Kind RecordKind

	// RecordTable.
	PutGen      uint64
	ResvNext    uint64
	TableLen    uint32
	FreeIndices []uint32 // released, Mount reuses the last first
	Mounts      []uint32 // mounted indices in mount order

	// RecordSegment, RecordRanges.
	Index      uint32
	Segment    alloc.Segment
	Unmounting bool
	Ranges     []alloc.Range

	// RecordClient.
	Client UUID

	// RecordObject, RecordReservation, RecordQuarantined.
	Key      string
	ID       uint64
	Size     uint64
	Complete bool
	Leased   bool
	SoftPin  bool
	HardPin  bool
	Gen      uint32
	Owner    UUID  // the writer, while unfinished
	Lease    int64 // PutStart time while unfinished; lease deadline or PutEnd time after
	Pin      int64 // soft-pin deadline
	PinTTL   int64 // 0 = the default
	Hashes   []uint64
	Segs     []uint32 // replicas, in replica order
	Addrs    []uint64
	Release  int64 // quarantined: release time
}

// ExportStats describes an export.
type ExportStats struct {
	Records, Objects int
	// LongestHold is the longest any one lock (a shard, the segment
	// table with the segments' range walks, the reservations, the
	// quarantine, the clients) was held; LongestShardHold the longest a
	// shard's (what puts and gets of its keys wait for).
	LongestHold      time.Duration
	LongestShardHold time.Duration
	Took             time.Duration
}

// Export writes the master's replicated state (what DumpState covers,
// plus the allocators' free-range order and the segment table's free
// indices, so that an imported master places every later allocation and
// mount as this one would) as records to emit, in RecordKind order. It
// runs while the master serves and takes one lock at a time, copying
// under it and emitting after, so emit's cost never holds a lock. The
// records are consistent only if no change runs meanwhile: snapshots are
// exported from a replica built from the log, not from a serving master.
func (m *Master) Export(emit func(*Record) error) (ExportStats, error) {
	var st ExportStats
	start := time.Now()
	held := func(t time.Time) time.Duration {
		d := time.Since(t)
		st.LongestHold = max(st.LongestHold, d)
		return d
	}
	var recs []*Record
	flush := func() error {
		for _, r := range recs {
			st.Records++
			if err := emit(r); err != nil {
				return err
			}
		}
		clear(recs)
		recs = recs[:0]
		return nil
	}

	t := time.Now()
	m.segMu.Lock()
	next := m.resvNext.Load()
	n, free := m.alloc.Indices()
	segs := m.alloc.Segments()
	tab := &Record{Kind: RecordTable, PutGen: m.putGen.Load(), ResvNext: next, TableLen: n, FreeIndices: free}
	recs = append(recs, tab)
	for _, s := range segs {
		tab.Mounts = append(tab.Mounts, s.Index)
		recs = append(recs, &Record{Kind: RecordSegment, Index: s.Index, Segment: s.Segment, Unmounting: s.Unmounting})
		rs, _ := m.alloc.Layout(s.Index)
		for len(rs) > 0 {
			k := min(len(rs), MaxRangesPerRecord)
			recs = append(recs, &Record{Kind: RecordRanges, Index: s.Index, Ranges: rs[:k:k]})
			rs = rs[k:]
		}
	}
	m.segMu.Unlock()
	held(t)
	if err := flush(); err != nil {
		return st, err
	}

	t = time.Now()
	m.clientMu.RLock()
	for id := range m.clients {
		recs = append(recs, &Record{Kind: RecordClient, Client: id})
	}
	m.clientMu.RUnlock()
	held(t)
	slices.SortFunc(recs, func(a, b *Record) int {
		if a.Client.Hi != b.Client.Hi {
			return cmpU64(a.Client.Hi, b.Client.Hi)
		}
		return cmpU64(a.Client.Lo, b.Client.Lo)
	})
	if err := flush(); err != nil {
		return st, err
	}

	// Under a shard's lock only copy its objects (ext included: the
	// master replaces ext's slices, never writes into them); build the
	// records after.
	type copied struct {
		key string
		o   object
		ext objExt
	}
	var objs []copied
	for i := range m.shards {
		sh := &m.shards[i]
		t = time.Now()
		sh.mu.Lock()
		objs = slices.Grow(objs[:0], sh.len())
		sh.each(func(k string, o *object) bool {
			c := copied{key: k, o: *o}
			if c.o.ext != nil {
				c.ext = *c.o.ext
			}
			objs = append(objs, c)
			return true
		})
		sh.mu.Unlock()
		st.LongestShardHold = max(st.LongestShardHold, held(t))
		for i := range objs {
			c := &objs[i]
			if c.o.ext != nil {
				c.o.ext = &c.ext
			}
			r := objectRecord(&c.o)
			r.Kind, r.Key = RecordObject, c.key
			recs = append(recs, r)
		}
		clear(objs)
		st.Objects += len(recs)
		if err := flush(); err != nil {
			return st, err
		}
	}

	t = time.Now()
	for i := range m.resv {
		rs := &m.resv[i]
		rs.mu.Lock()
		for id, o := range rs.m {
			r := objectRecord(&o)
			r.Kind, r.ID = RecordReservation, id
			recs = append(recs, r)
		}
		rs.mu.Unlock()
	}
	held(t)
	slices.SortFunc(recs, func(a, b *Record) int { return cmpU64(a.ID, b.ID) })
	if err := flush(); err != nil {
		return st, err
	}

	t = time.Now()
	m.discardMu.Lock()
	for _, q := range m.discarded {
		r := &Record{Kind: RecordQuarantined, Key: q.key, Size: q.size, Release: q.releaseAt}
		for _, p := range q.ps {
			r.Segs = append(r.Segs, p.Seg)
			r.Addrs = append(r.Addrs, p.Addr)
		}
		recs = append(recs, r)
	}
	m.discardMu.Unlock()
	held(t)
	if err := flush(); err != nil {
		return st, err
	}
	st.Took = time.Since(start)
	return st, nil
}

// ExportCount is how many records Export would write now (a snapshot's
// header announces it before the records).
func (m *Master) ExportCount() int {
	n := 1
	m.segMu.Lock()
	for _, s := range m.alloc.Segments() {
		rs, _ := m.alloc.Layout(s.Index)
		n += 1 + (len(rs)+MaxRangesPerRecord-1)/MaxRangesPerRecord
	}
	m.segMu.Unlock()
	m.clientMu.RLock()
	n += len(m.clients)
	m.clientMu.RUnlock()
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += sh.len()
		sh.mu.Unlock()
	}
	n += m.reservations()
	m.discardMu.Lock()
	n += len(m.discarded)
	m.discardMu.Unlock()
	return n
}

func objectRecord(o *object) *Record {
	r := &Record{Size: o.size(), Complete: o.complete(), Leased: o.has(fLeased), SoftPin: o.has(fSoftPin),
		HardPin: o.has(fHardPin), Gen: o.gen, Lease: o.lease, Pin: o.pin()}
	if e := o.ext; e != nil {
		r.Owner, r.PinTTL, r.Hashes = e.owner, e.pinTTL, slices.Clone(e.hashes)
	}
	ps := o.placements()
	r.Segs = make([]uint32, len(ps))
	r.Addrs = make([]uint64, len(ps))
	for i, p := range ps {
		r.Segs[i], r.Addrs[i] = p.Seg, p.Addr
	}
	return r
}

// ErrBadSnapshot is returned by Import for records that do not describe a
// consistent state (out of order, unknown segments, replicas that are not
// exactly the allocated ranges).
var ErrBadSnapshot = errors.New("master: bad snapshot")

func badSnap(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadSnapshot, fmt.Sprintf(format, args...))
}

// Importer loads Export's records into a fresh master: New, then
// NewImporter, Add every record in order, Finish, and only then Start.
// Import logs nothing: the log goes on from the snapshot's seq.
type Importer struct {
	m        *Master
	table    bool
	mounted  int // RecordSegment records seen
	restored bool
	done     bool
	segs     map[uint32]*importSeg
}

type importSeg struct {
	seg        alloc.Segment
	unmounting bool
	ranges     []alloc.Range
	used       []alloc.Placement // after restore, by address
	size       []uint64          // their reserved sizes
	taken      []bool
}

// NewImporter starts an import into m, which must be fresh (no segment,
// key or client) and not started.
func (m *Master) NewImporter() (*Importer, error) {
	m.runMu.Lock()
	started := m.started || m.closed
	m.runMu.Unlock()
	n, _ := m.alloc.Indices()
	m.clientMu.RLock()
	nc := len(m.clients)
	m.clientMu.RUnlock()
	if started || n != 0 || m.hasKeys() || nc != 0 || m.reservations() != 0 {
		return nil, errors.New("master: import into a master that is started or not empty")
	}
	return &Importer{m: m, segs: map[uint32]*importSeg{}}, nil
}

// Add applies one record.
func (im *Importer) Add(r *Record) error {
	if im.done {
		return errors.New("master: import finished")
	}
	if r.Kind != RecordTable && !im.table {
		return badSnap("%v record before the table", r.Kind)
	}
	m := im.m
	switch r.Kind {
	case RecordTable:
		if im.table {
			return badSnap("a second table record")
		}
		if err := m.alloc.RestoreIndices(r.TableLen, r.FreeIndices, r.Mounts); err != nil {
			return badSnap("segment table: %v", err)
		}
		m.putGen.Store(r.PutGen)
		m.resvNext.Store(r.ResvNext)
		im.table = true
		return nil
	case RecordSegment:
		if im.restored {
			return badSnap("segment %d after the objects", r.Index)
		}
		idx, err := m.alloc.Mount(r.Segment, nil)
		if err != nil {
			return badSnap("segment %d: %v", r.Index, err)
		}
		if idx != r.Index {
			return badSnap("segment %v mounted at index %d, recorded %d", r.Segment.ID, idx, r.Index)
		}
		im.segs[idx] = &importSeg{seg: r.Segment, unmounting: r.Unmounting}
		im.mounted++
		return nil
	case RecordRanges:
		s := im.segs[r.Index]
		if s == nil || im.restored {
			return badSnap("ranges of segment %d out of place", r.Index)
		}
		s.ranges = append(s.ranges, r.Ranges...)
		return nil
	}
	if err := im.restore(); err != nil {
		return err
	}
	switch r.Kind {
	case RecordClient:
		m.clientMu.Lock()
		defer m.clientMu.Unlock()
		if _, ok := m.clients[r.Client]; ok {
			return badSnap("client %v twice", r.Client)
		}
		c := &client{}
		c.lastSeen.Store(m.now()) // liveness restarts with a grace of ClientTTL
		m.clients[r.Client] = c
		return nil
	case RecordObject:
		if err := m.checkKey(r.Key); err != nil {
			return badSnap("object key: %v", err)
		}
		o, err := im.object(r)
		if err != nil {
			return err
		}
		sh, h := m.locate(r.Key)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if sh.get(r.Key, h) != nil {
			return badSnap("object %q twice", r.Key)
		}
		sh.insert(r.Key, h, o)
		if !o.complete() {
			sh.pending++
		}
		if r.SoftPin {
			m.softPinned.Add(1)
		}
		if r.HardPin {
			m.hardPinned.Add(1)
		}
		return nil
	case RecordReservation:
		if r.Complete || r.ID == 0 || r.ID > m.resvNext.Load() {
			return badSnap("reservation %d (last id %d, complete %v)", r.ID, m.resvNext.Load(), r.Complete)
		}
		o, err := im.object(r)
		if err != nil {
			return err
		}
		if m.resvHolding(r.ID) != nil {
			return badSnap("reservation %d twice", r.ID)
		}
		rs := m.resvOf(o.owner())
		rs.mu.Lock()
		defer rs.mu.Unlock()
		rs.m[r.ID] = o
		m.reservedBytes.Add(int64(r.Size))
		return nil
	case RecordQuarantined:
		ps, err := im.placements(r)
		if err != nil {
			return err
		}
		m.discardMu.Lock()
		m.discarded = append(m.discarded, quarantined{key: r.Key, ps: ps, size: r.Size, releaseAt: r.Release})
		m.quarantinedN.Add(int64(len(ps)))
		m.discardMu.Unlock()
		return nil
	}
	return badSnap("unknown record kind %d", r.Kind)
}

func (k RecordKind) String() string {
	names := []string{"", "table", "segment", "ranges", "client", "object", "reservation", "quarantined"}
	if int(k) < len(names) && k != 0 {
		return names[k]
	}
	return fmt.Sprintf("RecordKind(%d)", k)
}

// restore rebuilds every segment's allocator once all segments and
// ranges are in.
func (im *Importer) restore() error {
	if im.restored {
		return nil
	}
	im.restored = true
	for idx, s := range im.segs {
		ps, err := im.m.alloc.Restore(idx, s.ranges)
		if err != nil {
			return badSnap("segment %d: %v", idx, err)
		}
		s.used = ps
		s.taken = make([]bool, len(ps))
		for _, r := range s.ranges {
			if !r.Free {
				s.size = append(s.size, r.Size)
			}
		}
		s.ranges = nil
	}
	return nil
}

// placements finds r's replicas among the restored used ranges; each is
// taken once, by a replica of exactly its reserved size.
func (im *Importer) placements(r *Record) ([]alloc.Placement, error) {
	if len(r.Segs) == 0 || len(r.Segs) != len(r.Addrs) || r.Size == 0 {
		return nil, badSnap("%v %q/%d: %d segments, %d addresses, size %d", r.Kind, r.Key, r.ID, len(r.Segs), len(r.Addrs), r.Size)
	}
	ps := make([]alloc.Placement, len(r.Segs))
	for i, seg := range r.Segs {
		s := im.segs[seg]
		if s == nil {
			return nil, badSnap("%v %q/%d: replica on unknown segment %d", r.Kind, r.Key, r.ID, seg)
		}
		j, ok := findAddr(s.used, r.Addrs[i])
		if !ok || s.taken[j] || s.size[j] != alloc.Reserved(r.Size) {
			return nil, badSnap("%v %q/%d: replica %d:%#x is not an allocated range of its size", r.Kind, r.Key, r.ID, seg, r.Addrs[i])
		}
		s.taken[j] = true
		ps[i] = s.used[j]
	}
	return ps, nil
}

// findAddr finds addr among ps (by ascending address): a guess by
// interpolation (replicas are spread evenly enough), then a gallop and a
// binary search around it. Objects arrive in hash order, so a plain
// binary search misses the cache at every step.
func findAddr(ps []alloc.Placement, addr uint64) (int, bool) {
	n := len(ps)
	if n == 0 || addr < ps[0].Addr || addr > ps[n-1].Addr {
		return 0, false
	}
	g := 0
	if span := ps[n-1].Addr - ps[0].Addr; span > 0 {
		g = min(int(float64(addr-ps[0].Addr)/float64(span)*float64(n-1)), n-1)
	}
	lo, hi := g, g+1 // the answer is in [lo, hi)
	for step := 1; lo > 0 && ps[lo].Addr > addr; step *= 2 {
		hi, lo = lo, max(lo-step, 0)
	}
	for step := 1; hi < n && ps[hi-1].Addr < addr; step *= 2 {
		lo, hi = hi, min(hi+step, n)
	}
	j, ok := slices.BinarySearchFunc(ps[lo:hi], addr, func(p alloc.Placement, a uint64) int { return cmpU64(p.Addr, a) })
	return lo + j, ok
}

func (im *Importer) object(r *Record) (object, error) {
	ps, err := im.placements(r)
	if err != nil {
		return object{}, err
	}
	o := newObject(r.Size, r.Lease, ps[0], r.Gen)
	for _, f := range []struct {
		on bool
		f  uint8
	}{{r.Complete, fComplete}, {r.Leased, fLeased}, {r.SoftPin, fSoftPin}, {r.HardPin, fHardPin}} {
		if f.on {
			o.set(f.f)
		}
	}
	// Unfinished objects always have ext (pendingObject's shape).
	if !o.complete() || !r.Owner.IsZero() || r.PinTTL != 0 || len(r.Hashes) > 0 || len(ps) > 1 {
		o.ext = &objExt{owner: r.Owner, pinTTL: r.PinTTL}
		if len(r.Hashes) > 0 {
			o.ext.hashes = slices.Clone(r.Hashes)
		}
		if len(ps) > 1 {
			o.ext.more = ps[1:]
		}
	}
	o.setPin(r.Pin)
	return o, nil
}

// Finish checks that every allocated range belongs to a replica and
// marks the unmounting segments. The master may be started after.
func (im *Importer) Finish() error {
	if !im.table {
		return badSnap("no table record")
	}
	if err := im.restore(); err != nil {
		return err
	}
	im.done = true
	for idx, s := range im.segs {
		for j, ok := range s.taken {
			if !ok {
				return badSnap("segment %d: range %#x is allocated but no replica holds it", idx, s.used[j].Addr)
			}
		}
		if s.unmounting {
			if _, err := im.m.alloc.Unmount(s.seg.ID, nil); err != nil {
				return badSnap("segment %d: %v", idx, err)
			}
		}
	}
	return nil
}

// Import loads records from next (io.EOF-style: next returns nil, nil at
// the end) into the fresh master m; see Importer.
func (m *Master) Import(next func() (*Record, error)) error {
	im, err := m.NewImporter()
	if err != nil {
		return err
	}
	for {
		r, err := next()
		if err != nil {
			return err
		}
		if r == nil {
			return im.Finish()
		}
		if err := im.Add(r); err != nil {
			return err
		}
	}
}
