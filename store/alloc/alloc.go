package alloc

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/crescent-kv/crescent/internal/offalloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// Alignment is the alignment of every replica's offset and reserved size.
const Alignment = offalloc.DefaultAlignment

// MaxSegmentSize is the largest segment Mount accepts.
const MaxSegmentSize = offalloc.MaxSize

// ErrAborted is returned by Mount when its commit function refused the
// mount.
var ErrAborted = errors.New("alloc: mount aborted by commit")

// UUID identifies clients and segments (storepb.UUID on the wire).
type UUID struct{ Hi, Lo uint64 }

// IsZero reports whether u is the zero UUID.
func (u UUID) IsZero() bool { return u == UUID{} }

func (u UUID) String() string { return fmt.Sprintf("%016x-%016x", u.Hi, u.Lo) }

// Segment is memory a client contributes to the pool: bytes [Base,
// Base+Size) of the transfer-engine segment Name. Names need not be
// unique (one engine segment may be mounted as several pool segments, on
// ranges that do not overlap); IDs are.
type Segment struct {
	ID         UUID
	Name       string
	Base, Size uint64
	Client     UUID
	Protocol   string
	TEEndpoint string
}

// Strategy picks the segments a request's replicas go to.
type Strategy int

// Strategies. Preferred segments come first in all of them.
const (
	// Random picks uniformly among the segments that can hold the size.
	Random Strategy = iota
	// FreeRatioFirst picks the segments with the highest free ratio.
	FreeRatioFirst
	// LocalFirst picks the caller's own segments first, then at random.
	LocalFirst
)

var strategyNames = [...]string{"random", "free_ratio_first", "local_first"}

func (s Strategy) String() string {
	if s >= 0 && int(s) < len(strategyNames) {
		return strategyNames[s]
	}
	return fmt.Sprintf("Strategy(%d)", int(s))
}

// ParseStrategy parses the reference's names: random, free_ratio_first,
// local_first (case-insensitive; "" is random).
func ParseStrategy(s string) (Strategy, error) {
	if s == "" {
		return Random, nil
	}
	for i, n := range strategyNames {
		if strings.EqualFold(s, n) {
			return Strategy(i), nil
		}
	}
	return 0, fmt.Errorf("alloc: unknown allocation strategy %q (want random, free_ratio_first or local_first)", s)
}

// Request asks for space for one object.
type Request struct {
	Size uint64
	// Replicas wanted (< 1 means 1); placement is best effort.
	Replicas int
	// Preferred segment names, tried first in this order.
	Preferred []string
	// Local is the calling client: its own segments come first under
	// LocalFirst, or with SameNode under any strategy.
	Local    UUID
	SameNode bool
	// MinReplicas is the fewest placements acceptable (< 1 means 1):
	// suspect segments are chosen only to reach it, and fewer is
	// ErrNoAvailableHandle.
	MinReplicas int
	// NoSuspect: never choose suspect segments, even to reach MinReplicas.
	NoSuspect bool
	// Into, when its capacity holds Replicas, is where Choose puts its
	// answer (a batch allocates its items' answers at once).
	Into []uint32
}

// Placement is one replica's reservation. It is small and comparable; keep
// it to Free it later with the size it was allocated with.
type Placement struct {
	Addr uint64 // Segment.Base + offset
	h    offalloc.Handle
	Seg  uint32 // internal segment index
}

// SegmentStats describes a mounted segment.
type SegmentStats struct {
	Index       uint32
	Segment     Segment
	Capacity    uint64 // usable bytes
	Used        uint64 // reserved bytes
	Allocs      int
	LargestFree uint64
	Unmounting  bool
	Suspect     bool
}

type segState struct {
	Segment // never modified: SegmentOf hands out pointers to it
	idx     uint32
	cap     uint64
	// Every allocation writes what follows; the fields above are read
	// for every replica a reply describes, by both cores.
	_ [64]byte

	mu         sync.Mutex
	oa         *offalloc.Allocator
	unmounting bool // under mu; also mirrored in gone for lock-free reads
	released   bool // under mu: out of the table, frees refused

	gone     atomic.Bool
	suspect  atomic.Bool // written under mu (MarkSuspect)
	used     atomic.Uint64
	maxAlloc atomic.Uint64 // oa.MaxAlloc() after the last change
}

// table is the copy-on-write segment table.
type table struct {
	segs     segVec // by index; nil = free index
	byID     cowMap[UUID, uint32]
	byName   cowMap[string, []uint32]
	byClient cowMap[UUID, []uint32]
	live     []uint32 // mounted indices in mount order
	largest  uint64   // capacity of the largest segment
	nLargest int      // live segments of that capacity
}

func newTable() *table {
	return &table{byID: newCowMap[UUID, uint32](hashUUID), byName: newCowMap[string, []uint32](hashString),
		byClient: newCowMap[UUID, []uint32](hashUUID)}
}

// setLargest finds the largest capacity by walking every segment; a
// release needs it only when the last segment of that capacity goes.
func (t *table) setLargest() {
	t.largest, t.nLargest = 0, 0
	for _, i := range t.live {
		t.addLargest(t.segs.at(i).cap)
	}
}

// addLargest counts a new segment of capacity c.
func (t *table) addLargest(c uint64) {
	switch {
	case c > t.largest:
		t.largest, t.nLargest = c, 1
	case c == t.largest:
		t.nLargest++
	}
}

// name and client return the indices under one key (nil when none).
func (t *table) name(n string) []uint32 {
	v, _ := t.byName.get(n)
	return v
}

func (t *table) client(c UUID) []uint32 {
	v, _ := t.byClient.get(c)
	return v
}

// Allocator holds the mounted segments, one offset allocator each, and
// places replicas on them. Safe for concurrent use.
type Allocator struct {
	strategy Strategy

	mu   sync.Mutex // serialises table changes
	tab  atomic.Pointer[table]
	free []uint32 // released indices, reused last-in first-out

	capacity atomic.Uint64
	suspects atomic.Int64 // segments with suspect set

	rmu sync.Mutex
	rnd *rand.Rand // nil = the global source
}

// Option configures New.
type Option func(*Allocator)

// WithRand makes Choose's random picks reproducible.
func WithRand(seed uint64) Option {
	return func(a *Allocator) { a.rnd = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }
}

// New returns an allocator with no segments.
func New(s Strategy, opts ...Option) *Allocator {
	a := &Allocator{strategy: s}
	for _, o := range opts {
		o(a)
	}
	a.tab.Store(newTable())
	return a
}

// Strategy returns the allocator's strategy.
func (a *Allocator) Strategy() Strategy { return a.strategy }

// Reserved returns the bytes a replica of size bytes reserves (aligned and
// rounded up to its size class); sizes no segment can hold give
// math.MaxUint64.
func Reserved(size uint64) uint64 {
	if size > MaxSegmentSize {
		return math.MaxUint64
	}
	return offalloc.RoundUp(size, Alignment)
}

func (a *Allocator) intn(n int) int {
	if a.rnd == nil {
		return rand.IntN(n)
	}
	a.rmu.Lock()
	v := a.rnd.IntN(n)
	a.rmu.Unlock()
	return v
}

func (a *Allocator) seg(i uint32) *segState {
	t := a.tab.Load()
	return t.segs.get(i)
}

// Mount adds a segment and returns its index. commit, when not nil, runs
// before the segment becomes visible, with the table locked; an error from
// it abandons the mount (the master logs the mount there, so no placement
// on the segment can be logged before it). A segment with the same ID, or
// whose range overlaps a mounted (or unmounting) segment of the same Name,
// is ErrSegmentAlreadyExists; bad geometry is ErrInvalidParams.
func (a *Allocator) Mount(s Segment, commit func(idx uint32) error) (uint32, error) {
	switch {
	case s.ID.IsZero():
		return 0, errcode.New(errcode.InvalidParams, "segment id is zero")
	case s.Name == "":
		return 0, errcode.New(errcode.InvalidParams, "segment name is empty")
	case s.Size < Alignment || s.Size > MaxSegmentSize:
		return 0, errcode.New(errcode.InvalidParams, "segment size %d outside [%d, %d]", s.Size, Alignment, uint64(MaxSegmentSize))
	case s.Base+s.Size < s.Base:
		return 0, errcode.New(errcode.InvalidParams, "segment [%#x,+%d) wraps the address space", s.Base, s.Size)
	}
	oa, err := offalloc.New(s.Size)
	if err != nil {
		return 0, errcode.New(errcode.InvalidParams, "segment size %d: %v", s.Size, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.tab.Load()
	if i, ok := old.byID.get(s.ID); ok {
		return i, errcode.New(errcode.SegmentAlreadyExists, "segment %v (%s)", s.ID, old.segs.get(i).Name)
	}
	// Two pool segments over the same bytes would place two objects on
	// them: refuse any overlap within one engine segment, whoever mounts it.
	for _, i := range old.name(s.Name) {
		if o := old.segs.get(i); s.Base < o.Base+o.Size && o.Base < s.Base+s.Size {
			return i, errcode.New(errcode.SegmentAlreadyExists, "segment %v [%#x,%#x) of %q overlaps segment %v [%#x,%#x) of client %v",
				s.ID, s.Base, s.Base+s.Size, s.Name, o.ID, o.Base, o.Base+o.Size, o.Client)
		}
	}
	var idx uint32
	if n := len(a.free); n > 0 {
		idx = a.free[n-1]
	} else {
		idx = uint32(old.segs.len())
	}
	if commit != nil {
		if err := commit(idx); err != nil {
			return 0, fmt.Errorf("%w: %w", ErrAborted, err)
		}
	}
	if n := len(a.free); n > 0 {
		a.free = a.free[:n-1]
	}
	st := &segState{Segment: s, idx: idx, cap: oa.Size(), oa: oa}
	st.maxAlloc.Store(oa.MaxAlloc())
	t := old.clone()
	if int(idx) == t.segs.len() {
		t.segs.push(st)
	} else {
		t.segs.set(idx, st)
	}
	t.byID.set(s.ID, idx)
	t.byName.set(s.Name, append(slices.Clip(t.name(s.Name)), idx))
	t.byClient.set(s.Client, append(slices.Clip(t.client(s.Client)), idx))
	t.live = append(slices.Clip(t.live), idx)
	t.addLargest(st.cap)
	a.capacity.Add(st.cap)
	a.tab.Store(t)
	return idx, nil
}

// clone is a new version of the table: the index slices are copied (a
// few bytes per segment), the maps share all but the shards written.
func (t *table) clone() *table {
	return &table{
		segs:     t.segs, // copied chunk by chunk as it changes
		byID:     t.byID.clone(),
		byName:   t.byName.clone(),
		byClient: t.byClient.clone(),
		live:     t.live,
		largest:  t.largest,
		nLargest: t.nLargest,
	}
}

// Unmount stops placement on the segment with this ID and returns its
// index; the segment stays (frees still work) until Release. commit, when
// not nil, runs with the segment locked, after which no allocation can
// happen on it. An unknown ID is ErrSegmentNotFound; a segment already
// unmounting is ErrUnavailableInCurrentStatus.
func (a *Allocator) Unmount(id UUID, commit func(idx uint32)) (uint32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tab.Load()
	idx, ok := t.byID.get(id)
	if !ok {
		return 0, errcode.New(errcode.SegmentNotFound, "segment %v", id)
	}
	s := t.segs.get(idx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unmounting {
		return idx, errcode.New(errcode.UnavailableInCurrentStatus, "segment %v is unmounting", id)
	}
	s.unmounting = true
	s.gone.Store(true)
	if commit != nil {
		commit(idx)
	}
	return idx, nil
}

// Release removes an unmounting segment from the table; its index may be
// reused by a later Mount. Placements still on it are forgotten (callers
// drop them first). commit, when not nil, runs with the table locked
// before the change is visible.
func (a *Allocator) Release(idx uint32, commit func()) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.tab.Load()
	s := old.segs.get(idx)
	if s == nil {
		return errcode.New(errcode.SegmentNotFound, "segment index %d", idx)
	}
	s.mu.Lock()
	if !s.unmounting {
		s.mu.Unlock()
		return errcode.New(errcode.UnavailableInCurrentStatus, "segment %v is not unmounting", s.ID)
	}
	s.released = true // from here on its counters do not move
	if s.suspect.Swap(false) {
		a.suspects.Add(-1)
	}
	s.mu.Unlock()
	if commit != nil {
		commit()
	}
	t := old.clone()
	t.segs.set(idx, nil)
	t.byID.del(s.ID)
	if l := without(t.name(s.Name), idx); len(l) > 0 {
		t.byName.set(s.Name, l)
	} else {
		t.byName.del(s.Name)
	}
	if l := without(t.client(s.Client), idx); len(l) > 0 {
		t.byClient.set(s.Client, l)
	} else {
		t.byClient.del(s.Client)
	}
	t.live = without(t.live, idx)
	if s.cap == t.largest {
		if t.nLargest--; t.nLargest == 0 {
			t.setLargest()
		}
	}
	a.free = append(a.free, idx)
	a.capacity.Add(-s.cap)
	a.tab.Store(t)
	return nil
}

func without(s []uint32, v uint32) []uint32 {
	out := make([]uint32, 0, len(s))
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

// Counts returns how many segments are mounted or unmounting, in all
// and of client.
func (a *Allocator) Counts(client UUID) (total, own int) {
	t := a.tab.Load()
	return t.byID.len(), len(t.client(client))
}

// Lookup returns the index of the segment with this ID.
func (a *Allocator) Lookup(id UUID) (uint32, bool) {
	return a.tab.Load().byID.get(id)
}

// Segment returns the segment at index seg.
func (a *Allocator) Segment(seg uint32) (Segment, bool) {
	if s := a.seg(seg); s != nil {
		return s.Segment, true
	}
	return Segment{}, false
}

// SegmentOf is Segment without the copy: the description is never
// modified (a mount at a reused index gets a new one). A segment that is
// not mounted has the zero description.
func (a *Allocator) SegmentOf(seg uint32) *Segment {
	if s := a.seg(seg); s != nil {
		return &s.Segment
	}
	return &noSegment
}

var noSegment Segment

// ByClient returns the indices of the segments a client mounted.
func (a *Allocator) ByClient(c UUID) []uint32 {
	return slices.Clone(a.tab.Load().client(c))
}

// Stat returns one segment's stats.
func (a *Allocator) Stat(seg uint32) (SegmentStats, bool) {
	s := a.seg(seg)
	if s == nil {
		return SegmentStats{}, false
	}
	return s.stats(), true
}

func (s *segState) stats() SegmentStats {
	s.mu.Lock()
	st := s.oa.Stats()
	un := s.unmounting
	s.mu.Unlock()
	return SegmentStats{Index: s.idx, Segment: s.Segment, Capacity: st.Size, Used: st.Size - st.Free,
		Allocs: st.Allocs, LargestFree: st.LargestFree, Unmounting: un, Suspect: s.suspect.Load()}
}

// Segments returns every mounted segment (unmounting ones included) in
// mount order.
func (a *Allocator) Segments() []SegmentStats {
	t := a.tab.Load()
	out := make([]SegmentStats, 0, len(t.live))
	for _, i := range t.live {
		out = append(out, t.segs.at(i).stats())
	}
	return out
}

// LargestSegment returns the capacity of the largest mounted segment: no
// replica larger than that can ever be placed.
func (a *Allocator) LargestSegment() uint64 { return a.tab.Load().largest }

// Totals returns the capacity of all mounted segments and the bytes
// reserved on them.
func (a *Allocator) Totals() (capacity, used uint64) {
	t := a.tab.Load()
	for _, i := range t.live {
		used += t.segs.at(i).used.Load()
	}
	return a.capacity.Load(), used
}

// Choose picks up to r.Replicas distinct segments that can hold r.Size
// now: preferred names first, then (LocalFirst or SameNode) the caller's
// own segments, then by strategy; suspect segments only when the others
// give fewer than r.MinReplicas. It returns ErrNoAvailableHandle when
// fewer than r.MinReplicas (at least one) segments can hold the size. The
// answer is a hint: AllocateOn may still fail when others allocate
// meanwhile.
func (a *Allocator) Choose(r Request) ([]uint32, error) {
	want := max(r.Replicas, 1)
	least := min(max(r.MinReplicas, 1), want)
	if r.Size == 0 {
		return nil, errcode.New(errcode.InvalidParams, "size 0")
	}
	if r.Size > MaxSegmentSize {
		return nil, errcode.New(errcode.NoAvailableHandle, "size %d exceeds every segment", r.Size)
	}
	need := Reserved(r.Size)
	t := a.tab.Load()
	out := r.Into[:0]
	if cap(out) < want {
		out = make([]uint32, 0, want)
	}
	fitsAny := func(i uint32, out []uint32) bool {
		s := t.segs.at(i)
		return s != nil && !s.gone.Load() && s.maxAlloc.Load() >= need && !slices.Contains(out, i)
	}
	fits := func(i uint32, out []uint32) bool { return fitsAny(i, out) && !t.segs.at(i).suspect.Load() }
	out = a.choose(t, r, out, want, fits)
	if len(out) < least && !r.NoSuspect && a.suspects.Load() > 0 {
		// Writes to a suspect segment failed lately; use one only to
		// reach the minimum (a false report must not stop every put).
		out = a.choose(t, r, out, least, fitsAny)
	}
	switch {
	case len(out) == 0:
		return nil, errcode.New(errcode.NoAvailableHandle, "no segment can hold %d bytes", r.Size)
	case len(out) < least:
		return nil, errcode.New(errcode.NoAvailableHandle, "%d replicas required, only %d segments can hold %d bytes", least, len(out), r.Size)
	}
	return out, nil
}

// choose appends to out, up to want, the segments fits accepts, in the
// order of Choose.
func (a *Allocator) choose(t *table, r Request, out []uint32, want int, fits func(uint32, []uint32) bool) []uint32 {
	for _, name := range r.Preferred {
		for _, i := range t.name(name) {
			if len(out) < want && fits(i, out) {
				out = append(out, i)
			}
		}
	}
	if a.strategy == LocalFirst || r.SameNode {
		for _, i := range t.client(r.Local) {
			if len(out) < want && fits(i, out) {
				out = append(out, i)
			}
		}
	}
	if len(out) < want {
		if a.strategy == FreeRatioFirst {
			out = a.pickFreest(t, out, want, fits)
		} else {
			out = a.pickRandom(t, out, want, fits)
		}
	}
	return out
}

// MarkSuspect makes segment id suspect: Choose avoids it while other
// segments can take the request. It returns the segment's client, whether
// the flag changed, and false for an unknown, unmounting or released
// segment (nothing changes then).
func (a *Allocator) MarkSuspect(id UUID) (client UUID, changed, ok bool) {
	i, found := a.tab.Load().byID.get(id)
	if !found {
		return UUID{}, false, false
	}
	s := a.seg(i)
	if s == nil || s.ID != id {
		return UUID{}, false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unmounting || s.released {
		return s.Client, false, false
	}
	if !s.suspect.Swap(true) {
		a.suspects.Add(1)
		return s.Client, true, true
	}
	return s.Client, false, true
}

// ClearSuspect clears the suspect flag of client's segments and returns
// how many had it.
func (a *Allocator) ClearSuspect(client UUID) int {
	if a.suspects.Load() == 0 {
		return 0
	}
	t := a.tab.Load()
	n := 0
	for _, i := range t.client(client) {
		s := t.segs.at(i)
		s.mu.Lock()
		if !s.released && s.suspect.Swap(false) {
			a.suspects.Add(-1)
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// Suspects returns the number of suspect segments.
func (a *Allocator) Suspects() int { return int(a.suspects.Load()) }

// Placeable returns the number of mounted segments not being unmounted
// (suspect ones only with suspect set): a request for more replicas than
// that cannot be met however much room is made.
func (a *Allocator) Placeable(suspect bool) int {
	t := a.tab.Load()
	n := 0
	for _, i := range t.live {
		if s := t.segs.at(i); !s.gone.Load() && (suspect || !s.suspect.Load()) {
			n++
		}
	}
	return n
}

// pickRandom samples among more than sampleAbove segments, giving up on
// sampling after sampleTries rejections in a row (with half the segments
// able to take a put, that happens once in 256 picks).
const (
	sampleAbove = 64
	sampleTries = 8
)

// pickRandom appends, up to want, segments fits accepts, each uniform
// among those left. Among many segments it samples: a pick tries random
// segments (a rejected one costs a try), so a put does not walk thousands
// of segments; if sampling misses (most segments full or suspect), the
// rest are picked from a walk of all of them, as among few.
func (a *Allocator) pickRandom(t *table, out []uint32, want int, fits func(uint32, []uint32) bool) []uint32 {
	if n := len(t.live); n > sampleAbove {
		for misses := 0; len(out) < want && misses < sampleTries; {
			if i := t.live[a.intn(n)]; fits(i, out) {
				out, misses = append(out, i), 0
			} else {
				misses++
			}
		}
		if len(out) >= want {
			return out
		}
	}
	var buf [64]uint32
	cand := buf[:0]
	for _, i := range t.live {
		if fits(i, out) {
			cand = append(cand, i)
		}
	}
	// Partial Fisher-Yates: the first k picks are a uniform sample.
	for k := 0; k < len(cand) && len(out) < want; k++ {
		j := k + a.intn(len(cand)-k)
		cand[k], cand[j] = cand[j], cand[k]
		out = append(out, cand[k])
	}
	return out
}

// freestSamples is how many random segments pickFreest compares per
// replica among more than sampleAbove: the freest of 16 is in the top
// 1/16 of the segments with probability 1-(15/16)^16, about 0.64, and
// in the top quarter with probability 0.99, at a sixteenth of a walk's
// cost among 256 and a thousandth among 16,384.
const freestSamples = 16

// pickFreest appends, up to want, the segments fits accepts with the
// highest free ratio: among at most sampleAbove segments (or when
// sampling finds none that fits) the freest of all, walking every
// segment per replica; among more, the freest of freestSamples random
// ones (power of d choices: fill stays balanced, and a put does not
// walk thousands of segments).
func (a *Allocator) pickFreest(t *table, out []uint32, want int, fits func(uint32, []uint32) bool) []uint32 {
	ratio := func(i uint32) float64 {
		s := t.segs.at(i)
		return float64(s.cap-s.used.Load()) / float64(s.cap)
	}
	if n := len(t.live); n > sampleAbove {
		for len(out) < want {
			best, bestRatio := uint32(0), -1.0
			for range freestSamples {
				if i := t.live[a.intn(n)]; fits(i, out) {
					if r := ratio(i); r > bestRatio {
						best, bestRatio = i, r
					}
				}
			}
			if bestRatio < 0 {
				break // no sample fits: walk them all
			}
			out = append(out, best)
		}
		if len(out) >= want {
			return out
		}
	}
	for len(out) < want {
		best, bestRatio := uint32(0), -1.0
		for _, i := range t.live {
			if !fits(i, out) {
				continue
			}
			if r := ratio(i); r > bestRatio {
				best, bestRatio = i, r
			}
		}
		if bestRatio < 0 {
			break
		}
		out = append(out, best)
	}
	return out
}

// AllocateOn reserves Reserved(size) bytes on segment seg. The address
// depends only on the sequence of AllocateOn and Free calls on that
// segment since it was mounted, so a replayed log reproduces it. A full,
// unmounting or missing segment is ErrNoAvailableHandle /
// ErrSegmentNotFound.
func (a *Allocator) AllocateOn(seg uint32, size uint64) (Placement, error) {
	s := a.seg(seg)
	if s == nil {
		return Placement{}, errcode.New(errcode.SegmentNotFound, "segment index %d", seg)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return a.allocLocked(s, size)
}

func (a *Allocator) allocLocked(s *segState, size uint64) (Placement, error) {
	if s.unmounting {
		return Placement{}, errcode.New(errcode.NoAvailableHandle, "segment %s is unmounting", s.Name)
	}
	if size == 0 {
		return Placement{}, errcode.New(errcode.InvalidParams, "size 0")
	}
	al, err := s.oa.Alloc(size)
	if err != nil {
		return Placement{}, errcode.New(errcode.NoAvailableHandle, "segment %s: %v", s.Name, err)
	}
	s.used.Add(al.Size)
	s.maxAlloc.Store(s.oa.MaxAlloc())
	return Placement{Addr: s.Base + al.Offset, h: al.Handle, Seg: s.idx}, nil
}

// Allocate chooses segments and reserves size bytes on each: best effort,
// at least one placement or an error.
func (a *Allocator) Allocate(r Request) ([]Placement, error) {
	segs, err := a.Choose(r)
	if err != nil {
		return nil, err
	}
	ps := a.AllocateSet(segs, r.Size, nil)
	if len(ps) == 0 {
		return nil, errcode.New(errcode.NoAvailableHandle, "no segment can hold %d bytes", r.Size)
	}
	return ps, nil
}

// AllocateSet reserves size bytes on each of the distinct segments segs,
// in that order, skipping those that cannot (best effort). It holds the
// segments' locks (in index order) across the allocations and commit, so
// what commit records is ordered with every other change on those
// segments. commit sees the placements made (possibly none).
func (a *Allocator) AllocateSet(segs []uint32, size uint64, commit func([]Placement)) []Placement {
	return a.AllocateSetInto(nil, segs, size, commit)
}

// AllocateSetInto is AllocateSet appending the placements to dst[:0],
// whose array it reuses when large enough.
func (a *Allocator) AllocateSetInto(dst []Placement, segs []uint32, size uint64, commit func([]Placement)) []Placement {
	var buf [4]*segState
	locked := a.lockSet(segs, buf[:0])
	defer unlockSet(locked)
	ps := dst[:0]
	if cap(ps) < len(segs) {
		ps = make([]Placement, 0, len(segs))
	}
	for _, i := range segs {
		// The segment locked, not the table's entry now: a release and a
		// mount in between may have put another segment at index i,
		// whose lock we do not hold (its unmounting flag refuses us).
		if s := lockedAt(locked, i); s != nil {
			if p, err := a.allocLocked(s, size); err == nil {
				ps = append(ps, p)
			}
		}
	}
	if commit != nil {
		commit(ps)
	}
	return ps
}

// lockedAt is the segment of index i among those lockSet locked.
func lockedAt(locked []*segState, i uint32) *segState {
	for _, s := range locked {
		if s.idx == i {
			return s
		}
	}
	return nil
}

// lockSet locks the distinct live segments among idx in index order,
// appending them to locked.
func (a *Allocator) lockSet(idx []uint32, locked []*segState) []*segState {
	t := a.tab.Load()
	for _, i := range idx {
		if s := t.segs.get(i); s != nil && !slices.Contains(locked, s) {
			locked = append(locked, s)
		}
	}
	slices.SortFunc(locked, func(x, y *segState) int { return int(x.idx) - int(y.idx) })
	for _, s := range locked {
		s.mu.Lock()
	}
	return locked
}

func unlockSet(locked []*segState) {
	for i := len(locked) - 1; i >= 0; i-- {
		locked[i].mu.Unlock()
	}
}

// Free releases a placement made with this size. A placement that is not
// live (double free, wrong size, released segment) is an error and
// changes nothing.
func (a *Allocator) Free(p Placement, size uint64) error {
	s := a.seg(p.Seg)
	if s == nil {
		return errcode.New(errcode.SegmentNotFound, "segment index %d", p.Seg)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return a.freeLocked(s, p, size)
}

func (a *Allocator) freeLocked(s *segState, p Placement, size uint64) error {
	if s.released {
		return errcode.New(errcode.SegmentNotFound, "segment %s was released", s.Name)
	}
	if p.Addr < s.Base {
		return errcode.New(errcode.InvalidParams, "address %#x below segment %s", p.Addr, s.Name)
	}
	r := Reserved(size)
	if err := s.oa.Free(offalloc.Allocation{Offset: p.Addr - s.Base, Size: r, Handle: p.h}); err != nil {
		return errcode.New(errcode.InvalidParams, "free %#x+%d on %s: %v", p.Addr, size, s.Name, err)
	}
	s.used.Add(-r)
	s.maxAlloc.Store(s.oa.MaxAlloc())
	return nil
}

// FreeSet frees placements made with this size, holding their segments'
// locks (in index order) across the frees and commit. It frees all it can
// and returns the first error.
func (a *Allocator) FreeSet(ps []Placement, size uint64, commit func()) error {
	var buf [4]uint32
	idx := buf[:0]
	for _, p := range ps {
		idx = append(idx, p.Seg)
	}
	var lbuf [4]*segState
	locked := a.lockSet(idx, lbuf[:0])
	defer unlockSet(locked)
	var first error
	for _, p := range ps {
		var err error
		if s := a.seg(p.Seg); s == nil || !slices.Contains(locked, s) {
			err = errcode.New(errcode.SegmentNotFound, "segment index %d", p.Seg)
		} else {
			err = a.freeLocked(s, p, size)
		}
		if first == nil {
			first = err
		}
	}
	if commit != nil {
		commit()
	}
	return first
}
