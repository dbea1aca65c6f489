package offalloc

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"

	"github.com/crescent-kv/crescent/internal/invariants"
)

const (
	mantissaBits  = 3
	mantissaValue = 1 << mantissaBits
	mantissaMask  = mantissaValue - 1

	topBins  = 64
	leafBins = mantissaValue

	// NumClasses is the number of size classes (bins).
	NumClasses = topBins * leafBins
	// MaxSize is the largest address space New accepts. It keeps every
	// rounded size representable in a uint64.
	MaxSize = uint64(1) << 62
	// DefaultAlignment is the alignment of offsets and sizes unless
	// WithAlignment says otherwise.
	DefaultAlignment = 64

	none = ^uint32(0)
	// maxNodes bounds the node slice so indices (plus one) fit a uint32.
	maxNodes = int(none) - 1
)

var (
	// ErrInvalidSize is returned for a zero size or an address space larger
	// than MaxSize.
	ErrInvalidSize = errors.New("offalloc: invalid size")
	// ErrInvalidAlignment is returned for an alignment that is not a power
	// of two.
	ErrInvalidAlignment = errors.New("offalloc: alignment must be a power of two")
	// ErrNoSpace is returned when no free range can hold the request.
	ErrNoSpace = errors.New("offalloc: no free range large enough")
	// ErrNotAllocated is returned by Free for an allocation that is not live
	// in this allocator (double free, stale or foreign handle).
	ErrNotAllocated = errors.New("offalloc: not a live allocation of this allocator")
	// ErrTooManyRanges is returned when the node table would exceed 2^32-2
	// entries.
	ErrTooManyRanges = errors.New("offalloc: too many ranges")
)

// Handle identifies an allocation inside its Allocator: a node index and a
// 32-bit generation. The generation changes on every Free and starts at a
// per-allocator seed, so stale handles are always rejected and handles of
// another Allocator are rejected unless all 64 bits collide. The zero
// Handle is never valid.
type Handle struct {
	node uint32 // node index + 1
	gen  uint32
}

// Allocation is one allocated range. Size is the rounded size actually
// reserved (RoundUp of the request).
type Allocation struct {
	Offset uint64
	Size   uint64
	Handle Handle
}

// Stats describes an allocator's state.
type Stats struct {
	Size        uint64 // usable address space
	Free        uint64 // bytes in free ranges
	LargestFree uint64 // length of the longest free range
	Allocs      int    // live allocations
	FreeRanges  int    // number of free ranges
	Nodes       int    // node table capacity (peak ranges)
}

type node struct {
	off, size        uint64 // size 0 marks an unused node
	binPrev, binNext uint32 // bin list links; binNext links the unused list
	nbrPrev, nbrNext uint32 // address-order neighbours
	gen              uint32
	used             bool
}

// Allocator is an O(1) offset allocator. It is not safe for concurrent use.
type Allocator struct {
	seed   uint32 // first generation of every node: makes foreign handles fail
	size   uint64
	align  uint64
	free   uint64
	allocs int
	ranges int // free ranges

	// chunks hold the node table: every chunk but the last has chunkLen
	// nodes, so growing never copies more than one chunk.
	chunks [][]node
	first  []node // chunks[0]: most allocators have one chunk
	count  int    // nodes in all chunks
	unused uint32 // head of the unused-node list
	spare  int    // length of the unused-node list

	topMask  uint64
	leafMask [topBins]uint8
	binHead  [NumClasses]uint32
}

// Option configures New.
type Option func(*config) error

type config struct {
	align    uint64
	capacity int
}

// WithAlignment sets the alignment of every offset and size (a power of two,
// default 64).
func WithAlignment(align uint64) Option {
	return func(c *config) error {
		if align == 0 || align&(align-1) != 0 || align > MaxSize {
			return fmt.Errorf("%w: %d", ErrInvalidAlignment, align)
		}
		c.align = align
		return nil
	}
}

// WithCapacity preallocates room for n ranges so the first n-1 allocations
// never grow the node table.
func WithCapacity(n int) Option {
	return func(c *config) error {
		if n < 0 || n > maxNodes {
			return fmt.Errorf("offalloc: capacity %d out of range", n)
		}
		c.capacity = n
		return nil
	}
}

// New returns an allocator for the address space [0, size). size is rounded
// down to the alignment and must hold at least one aligned unit.
func New(size uint64, opts ...Option) (*Allocator, error) {
	c := config{align: DefaultAlignment, capacity: 16}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if size > MaxSize {
		return nil, fmt.Errorf("%w: %d exceeds %d", ErrInvalidSize, size, MaxSize)
	}
	size &^= c.align - 1
	if size == 0 {
		return nil, fmt.Errorf("%w: smaller than the alignment %d", ErrInvalidSize, c.align)
	}
	a := &Allocator{size: size, align: c.align, unused: none, seed: nextSeed()}
	for i := range a.binHead {
		a.binHead[i] = none
	}
	a.grow(max(c.capacity, 1))
	i := a.newNode()
	n := a.at(i)
	n.off, n.size = 0, size
	n.nbrPrev, n.nbrNext = none, none
	a.insertBin(i)
	a.free = size
	return a, nil
}

// Size returns the usable size of the address space.
func (a *Allocator) Size() uint64 { return a.size }

// Alignment returns the alignment of offsets and sizes.
func (a *Allocator) Alignment() uint64 { return a.align }

// RoundUp returns the number of bytes Alloc(size) reserves: size rounded up
// to the alignment and then to its size class. size must be at most Size().
func (a *Allocator) RoundUp(size uint64) uint64 { return RoundUp(size, a.align) }

// MaxAlloc returns the largest rounded size that Alloc can serve right now:
// Alloc(n) succeeds if and only if RoundUp(n) <= MaxAlloc(). O(1).
func (a *Allocator) MaxAlloc() uint64 {
	if a.topMask == 0 {
		return 0
	}
	t := 63 - bits.LeadingZeros64(a.topMask)
	l := 7 - bits.LeadingZeros8(a.leafMask[t])
	return ClassSize(t<<mantissaBits | l)
}

// Alloc reserves RoundUp(size) bytes. It returns ErrInvalidSize for size 0
// and ErrNoSpace when no free range is long enough.
func (a *Allocator) Alloc(size uint64) (Allocation, error) {
	if size == 0 {
		return Allocation{}, ErrInvalidSize
	}
	if size > a.size {
		return Allocation{}, ErrNoSpace
	}
	if err := a.reserve(2); err != nil {
		return Allocation{}, err
	}
	r := a.RoundUp(size)
	b := a.findBin(binUp(r))
	if b == none {
		return Allocation{}, ErrNoSpace
	}
	idx := a.binHead[b]
	a.removeBin(idx)
	al := a.carve(idx, 0, r)
	a.check(idx)
	return al, nil
}

// AllocAligned is Alloc with the offset aligned to align (a power of two).
// An alignment at most the allocator's own is the same as Alloc. For a
// larger one it looks at the first free range of the smallest fitting class
// and, if that cannot be aligned, at a class large enough for any
// alignment padding; it may therefore return ErrNoSpace although some
// fragmented range could have held the request (callers that need a
// guarantee fall back to Alloc). Padding in front of the allocation stays a
// free range.
func (a *Allocator) AllocAligned(size, align uint64) (Allocation, error) {
	if align == 0 || align&(align-1) != 0 || align > MaxSize {
		return Allocation{}, ErrInvalidAlignment
	}
	if align <= a.align {
		return a.Alloc(size)
	}
	if size == 0 {
		return Allocation{}, ErrInvalidSize
	}
	if size > a.size {
		return Allocation{}, ErrNoSpace
	}
	if err := a.reserve(2); err != nil {
		return Allocation{}, err
	}
	r := a.RoundUp(size)
	b := a.findBin(binUp(r))
	if b == none {
		return Allocation{}, ErrNoSpace
	}
	idx := a.binHead[b]
	pad := alignUp(a.at(idx).off, align) - a.at(idx).off
	if pad+r > a.at(idx).size {
		need := r + align - a.align // any range this long can be aligned
		if need > a.size {
			return Allocation{}, ErrNoSpace
		}
		if b = a.findBin(binUp(need)); b == none {
			return Allocation{}, ErrNoSpace
		}
		idx = a.binHead[b]
		pad = alignUp(a.at(idx).off, align) - a.at(idx).off
	}
	a.removeBin(idx)
	al := a.carve(idx, pad, r)
	a.check(idx)
	return al, nil
}

// Free releases an allocation and coalesces it with free neighbours. An
// allocation that is not live here (double free, stale or foreign handle,
// altered Offset or Size) gets ErrNotAllocated and changes nothing.
func (a *Allocator) Free(al Allocation) error {
	i := al.Handle.node - 1
	if al.Handle.node == 0 || int(i) >= a.count {
		return ErrNotAllocated
	}
	n := a.at(i)
	if !n.used || n.gen != al.Handle.gen || n.off != al.Offset || n.size != al.Size {
		return ErrNotAllocated
	}
	n.used = false
	n.gen++
	a.free += n.size
	a.allocs--
	if p := n.nbrPrev; p != none && !a.at(p).used {
		pn := a.at(p)
		a.removeBin(p)
		n.off = pn.off
		n.size += pn.size
		n.nbrPrev = pn.nbrPrev
		if pn.nbrPrev != none {
			a.at(pn.nbrPrev).nbrNext = i
		}
		a.releaseNode(p)
	}
	if q := n.nbrNext; q != none && !a.at(q).used {
		qn := a.at(q)
		a.removeBin(q)
		n.size += qn.size
		n.nbrNext = qn.nbrNext
		if qn.nbrNext != none {
			a.at(qn.nbrNext).nbrPrev = i
		}
		a.releaseNode(q)
	}
	a.insertBin(i)
	a.check(i)
	return nil
}

// Stats returns the allocator's counters. LargestFree walks the free list of
// the highest non-empty class; everything else is O(1).
func (a *Allocator) Stats() Stats {
	s := Stats{Size: a.size, Free: a.free, Allocs: a.allocs, FreeRanges: a.ranges, Nodes: a.count}
	if a.topMask != 0 {
		t := 63 - bits.LeadingZeros64(a.topMask)
		l := 7 - bits.LeadingZeros8(a.leafMask[t])
		for i := a.binHead[t<<mantissaBits|l]; i != none; i = a.at(i).binNext {
			s.LargestFree = max(s.LargestFree, a.at(i).size)
		}
	}
	return s
}

// carve turns the free node idx (already out of its bin) into an allocation
// of r bytes starting pad bytes into it; the pad and the tail become free
// ranges. reserve(2) must have been called.
func (a *Allocator) carve(idx uint32, pad, r uint64) Allocation {
	if pad > 0 {
		p := a.newNode()
		n, pn := a.at(idx), a.at(p)
		pn.off, pn.size = n.off, pad
		pn.nbrPrev, pn.nbrNext = n.nbrPrev, idx
		if n.nbrPrev != none {
			a.at(n.nbrPrev).nbrNext = p
		}
		n.nbrPrev = p
		n.off += pad
		n.size -= pad
		a.insertBin(p)
	}
	if rem := a.at(idx).size - r; rem > 0 {
		t := a.newNode()
		n, tn := a.at(idx), a.at(t)
		tn.off, tn.size = n.off+r, rem
		tn.nbrPrev, tn.nbrNext = idx, n.nbrNext
		if n.nbrNext != none {
			a.at(n.nbrNext).nbrPrev = t
		}
		n.nbrNext = t
		n.size = r
		a.insertBin(t)
	}
	n := a.at(idx)
	n.used = true
	a.free -= r
	a.allocs++
	return Allocation{Offset: n.off, Size: r, Handle: Handle{node: idx + 1, gen: n.gen}}
}

// findBin returns the first non-empty bin >= b, or none.
func (a *Allocator) findBin(b uint32) uint32 {
	t, l := b>>mantissaBits, b&mantissaMask
	if t >= topBins {
		return none
	}
	if a.topMask&(1<<t) != 0 {
		if m := a.leafMask[t] & (0xff << l); m != 0 {
			return t<<mantissaBits | uint32(bits.TrailingZeros8(m))
		}
	}
	m := a.topMask & (^uint64(0) << (t + 1)) // shift by 64 yields 0
	if m == 0 {
		return none
	}
	t = uint32(bits.TrailingZeros64(m))
	return t<<mantissaBits | uint32(bits.TrailingZeros8(a.leafMask[t]))
}

func (a *Allocator) insertBin(i uint32) {
	b := binDown(a.at(i).size)
	n := a.at(i)
	n.binPrev, n.binNext = none, a.binHead[b]
	if h := a.binHead[b]; h != none {
		a.at(h).binPrev = i
	}
	a.binHead[b] = i
	a.leafMask[b>>mantissaBits] |= 1 << (b & mantissaMask)
	a.topMask |= 1 << (b >> mantissaBits)
	a.ranges++
}

func (a *Allocator) removeBin(i uint32) {
	n := a.at(i)
	b := binDown(n.size)
	if n.binPrev != none {
		a.at(n.binPrev).binNext = n.binNext
	} else {
		a.binHead[b] = n.binNext
		if n.binNext == none {
			t := b >> mantissaBits
			a.leafMask[t] &^= 1 << (b & mantissaMask)
			if a.leafMask[t] == 0 {
				a.topMask &^= 1 << t
			}
		}
	}
	if n.binNext != none {
		a.at(n.binNext).binPrev = n.binPrev
	}
	n.binPrev, n.binNext = none, none
	a.ranges--
}

// reserve makes sure k unused nodes are available so carve never grows the
// table while holding node pointers.
func (a *Allocator) reserve(k int) error {
	if a.spare >= k {
		return nil
	}
	if a.count+k > maxNodes {
		return ErrTooManyRanges
	}
	// By an eighth, not double: the table is most of a store master's
	// per-object memory, and the cost stays amortised O(1).
	a.grow(min(max(a.count/8, k, 16), maxNodes-a.count))
	return nil
}

func (a *Allocator) grow(k int) {
	old := a.count
	for k > 0 {
		last := len(a.chunks) - 1
		if last < 0 || len(a.chunks[last]) == chunkLen {
			n := min(k, chunkLen)
			a.chunks = append(a.chunks, make([]node, n))
			k -= n
			continue
		}
		// Grow the partial last chunk exactly (append would round up by
		// a quarter): the copy is bounded by chunkLen nodes.
		c := a.chunks[last]
		n := min(len(c)+k, chunkLen)
		nc := make([]node, n)
		copy(nc, c)
		a.chunks[last] = nc
		k -= n - len(c)
	}
	a.count = (len(a.chunks)-1)*chunkLen + len(a.chunks[len(a.chunks)-1])
	a.first = a.chunks[0]
	for i := a.count - 1; i >= old; i-- {
		a.at(uint32(i)).gen = a.seed
		a.releaseNode(uint32(i))
	}
}

// chunkLen nodes (160 KiB) per chunk: the table of a master's allocator
// with millions of ranges grows without copying it whole.
const (
	chunkBits = 12
	chunkLen  = 1 << chunkBits
	chunkMask = chunkLen - 1
)

// at returns node i.
func (a *Allocator) at(i uint32) *node {
	if int(i) < len(a.first) {
		return &a.first[i]
	}
	return &a.chunks[i>>chunkBits][i&chunkMask]
}

var seeds atomic.Uint32

// nextSeed spreads successive allocators' generations over the 32-bit
// space so a handle from one allocator is rejected by another.
func nextSeed() uint32 { return seeds.Add(1) * 0x9e3779b9 }

func (a *Allocator) newNode() uint32 {
	i := a.unused
	n := a.at(i)
	a.unused = n.binNext
	a.spare--
	n.binPrev, n.binNext, n.nbrPrev, n.nbrNext = none, none, none, none
	n.used = false
	return i
}

func (a *Allocator) releaseNode(i uint32) {
	n := a.at(i)
	n.off, n.size, n.used = 0, 0, false
	n.binPrev, n.nbrPrev, n.nbrNext = none, none, none
	n.binNext = a.unused
	a.unused = i
	a.spare++
}

// check runs under the invariants tag after every mutation: a full
// validation while the table is small, else the ranges around node i.
func (a *Allocator) check(i uint32) {
	if !invariants.Enabled {
		return
	}
	var err error
	if a.count <= 256 {
		err = a.validate()
	} else {
		err = a.validateNear(i)
	}
	if err != nil {
		panic(err)
	}
}

// validateNear checks node i and its neighbours; O(1).
func (a *Allocator) validateNear(i uint32) error {
	lo, hi := i, i
	if p := a.at(i).nbrPrev; p != none {
		lo = p
	}
	if q := a.at(i).nbrNext; q != none {
		hi = q
	}
	for j := lo; ; j = a.at(j).nbrNext {
		n := a.at(j)
		if n.size == 0 || n.off%a.align != 0 || n.size%a.align != 0 || n.off+n.size > a.size {
			return fmt.Errorf("offalloc: invariant: node %d [%d,+%d) invalid", j, n.off, n.size)
		}
		if n.nbrPrev == none && n.off != 0 || n.nbrNext == none && n.off+n.size != a.size {
			return fmt.Errorf("offalloc: invariant: node %d [%d,+%d) at an end of the space", j, n.off, n.size)
		}
		if !n.used {
			b := binDown(n.size)
			if a.leafMask[b>>mantissaBits]&(1<<(b&mantissaMask)) == 0 {
				return fmt.Errorf("offalloc: invariant: free node %d not in bin %d", j, b)
			}
		}
		if q := n.nbrNext; q != none {
			m := a.at(q)
			if m.nbrPrev != j || m.off != n.off+n.size || !n.used && !m.used {
				return fmt.Errorf("offalloc: invariant: nodes %d and %d badly linked", j, q)
			}
		}
		if j == hi {
			return nil
		}
	}
}

// validate checks every structural invariant; O(nodes).
func (a *Allocator) validate() error {
	live := 0
	head := none
	for i := range uint32(a.count) {
		n := a.at(i)
		if n.size == 0 {
			continue
		}
		live++
		if n.nbrPrev == none {
			if head != none {
				return fmt.Errorf("offalloc: invariant: two first ranges %d and %d", head, i)
			}
			head = i
		}
	}
	if live+a.spare != a.count {
		return fmt.Errorf("offalloc: invariant: %d live + %d spare != %d nodes", live, a.spare, a.count)
	}
	spare := 0
	for i := a.unused; i != none; i = a.at(i).binNext {
		if a.at(i).size != 0 || spare > a.count {
			return fmt.Errorf("offalloc: invariant: bad unused list at node %d", i)
		}
		spare++
	}
	if spare != a.spare {
		return fmt.Errorf("offalloc: invariant: unused list has %d nodes, want %d", spare, a.spare)
	}
	var off, free uint64
	allocs, ranges, walked := 0, 0, 0
	prev := none
	for i := head; i != none; i = a.at(i).nbrNext {
		n := a.at(i)
		walked++
		if walked > live {
			return errors.New("offalloc: invariant: neighbour cycle")
		}
		if n.off != off || n.nbrPrev != prev {
			return fmt.Errorf("offalloc: invariant: node %d at %d (prev %d), want %d (prev %d)", i, n.off, n.nbrPrev, off, prev)
		}
		if n.off%a.align != 0 || n.size%a.align != 0 {
			return fmt.Errorf("offalloc: invariant: node %d [%d,+%d) misaligned", i, n.off, n.size)
		}
		if n.used {
			allocs++
		} else {
			free += n.size
			ranges++
			if prev != none && !a.at(prev).used {
				return fmt.Errorf("offalloc: invariant: adjacent free ranges %d and %d", prev, i)
			}
		}
		off += n.size
		prev = i
	}
	if walked != live || off != a.size {
		return fmt.Errorf("offalloc: invariant: walked %d of %d ranges covering %d of %d bytes", walked, live, off, a.size)
	}
	if allocs != a.allocs || free != a.free || ranges != a.ranges {
		return fmt.Errorf("offalloc: invariant: counted %d allocs %d free %d ranges, recorded %d %d %d",
			allocs, free, ranges, a.allocs, a.free, a.ranges)
	}
	inBins := 0
	for b := range uint32(NumClasses) {
		t, l := b>>mantissaBits, b&mantissaMask
		h := a.binHead[b]
		if (a.leafMask[t]&(1<<l) != 0) != (h != none) {
			return fmt.Errorf("offalloc: invariant: leaf bit of bin %d disagrees with its list", b)
		}
		if (a.topMask&(1<<t) != 0) != (a.leafMask[t] != 0) {
			return fmt.Errorf("offalloc: invariant: top bit %d disagrees with leaf mask", t)
		}
		p := none
		for i := h; i != none; i = a.at(i).binNext {
			n := a.at(i)
			if n.used || n.size == 0 || binDown(n.size) != b || n.binPrev != p {
				return fmt.Errorf("offalloc: invariant: node %d misfiled in bin %d", i, b)
			}
			inBins++
			if inBins > ranges {
				return errors.New("offalloc: invariant: bin lists hold more nodes than free ranges")
			}
			p = i
		}
	}
	if inBins != ranges {
		return fmt.Errorf("offalloc: invariant: %d nodes in bins, %d free ranges", inBins, ranges)
	}
	return nil
}

// RoundUp returns size rounded up to align (a power of two) and then to the
// size of its class. The result is a multiple of align and at most 12.5%
// above the aligned size. size must be at most MaxSize.
func RoundUp(size, align uint64) uint64 {
	return ClassSize(int(binUp(alignUp(size, align))))
}

// Class returns the size class a size rounds up to; for a size returned by
// RoundUp it is exact: ClassSize(Class(RoundUp(n, a))) == RoundUp(n, a).
func Class(size uint64) int { return int(binUp(size)) }

// ClassSize returns the size of class c (0 <= c < NumClasses).
func ClassSize(c int) uint64 {
	e, m := uint64(c)>>mantissaBits, uint64(c)&mantissaMask
	if e == 0 {
		return m
	}
	return (m | mantissaValue) << (e - 1)
}

// binUp is the smallest bin whose size is >= size.
func binUp(size uint64) uint32 {
	if size < mantissaValue {
		return uint32(size)
	}
	h := 63 - bits.LeadingZeros64(size)
	shift := h - mantissaBits
	b := uint32(shift+1)<<mantissaBits + uint32(size>>shift)&mantissaMask
	if size&(1<<shift-1) != 0 {
		b++ // carries into the exponent when the mantissa overflows
	}
	return b
}

// binDown is the largest bin whose size is <= size.
func binDown(size uint64) uint32 {
	if size < mantissaValue {
		return uint32(size)
	}
	h := 63 - bits.LeadingZeros64(size)
	shift := h - mantissaBits
	return uint32(shift+1)<<mantissaBits + uint32(size>>shift)&mantissaMask
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) &^ (a - 1) }

// Range is one range of the address space, as Ranges reports it.
type Range struct {
	Offset, Size uint64
	Free         bool
	// Rank is a free range's place in its size class's list (0: the one
	// the next Alloc of that class takes). Offsets, sizes and ranks fix
	// the result of every later Alloc and Free, so a copy rebuilt from
	// them (allocate everything in address order, then free the free
	// ranges by descending rank) behaves as this allocator does.
	Rank uint32
}

// Ranges returns every range, used and free, in address order. O(nodes).
func (a *Allocator) Ranges() []Range {
	rank := make(map[uint32]uint32, a.ranges)
	for b := range uint32(NumClasses) {
		r := uint32(0)
		for i := a.binHead[b]; i != none; i = a.at(i).binNext {
			rank[i] = r
			r++
		}
	}
	head := none
	for i := range uint32(a.count) {
		if n := a.at(i); n.size != 0 && n.nbrPrev == none {
			head = i
			break
		}
	}
	out := make([]Range, 0, a.allocs+a.ranges)
	for i := head; i != none; i = a.at(i).nbrNext {
		n := a.at(i)
		out = append(out, Range{Offset: n.off, Size: n.size, Free: !n.used, Rank: rank[i]})
	}
	return out
}
