package mempool

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/crescent-kv/crescent/internal/invariants"
	"github.com/crescent-kv/crescent/internal/offalloc"
)

// Sentinel errors. Errors returned by this package wrap one of these (or a
// unix.Errno from the kernel), so test them with errors.Is.
var (
	// ErrOutOfMemory: no slab (or run of free slabs) can hold the request.
	ErrOutOfMemory = errors.New("mempool: out of memory")
	// ErrInvalidSize: a size or option out of range (zero or negative
	// allocation, bad slab size, mapping larger than its file, ...).
	ErrInvalidSize = errors.New("mempool: invalid size")
	// ErrNotAllocated: Free of a slice that is not a live allocation of this
	// pool exactly as Alloc returned it (double free, foreign or re-sliced).
	ErrNotAllocated = errors.New("mempool: not a live allocation of this pool")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("mempool: pool closed")
)

const (
	// DefaultSlabSize is the slab size when Options.SlabSize is 0.
	DefaultSlabSize = 16 << 20
	// MinSlabSize and MaxSlabSize bound Options.SlabSize.
	MinSlabSize = 64 << 10
	MaxSlabSize = 1 << 30
	// Alignment is the minimum alignment of every allocation.
	Alignment = 64
	// pageAlign is the alignment given to requests whose rounded size is a
	// multiple of it.
	pageAlign = 4096
)

// Options configures New.
type Options struct {
	// Size of the arena in bytes, rounded up to a multiple of SlabSize (and
	// of the huge page size when hugetlb pages are used).
	Size int64
	// SlabSize is a power of two between MinSlabSize and MaxSlabSize;
	// 0 means DefaultSlabSize.
	SlabSize int64
	// HugePages asks for MFD_HUGETLB pages, falling back to transparent
	// huge pages (MADV_HUGEPAGE); Stats.HugePages says what took effect.
	HugePages bool
	// NoPrefault skips faulting the arena in at creation. Pages are then
	// allocated on first touch (slowly), and if the machine runs out of
	// memory the toucher gets SIGBUS instead of New failing.
	NoPrefault bool
	// Name of the memfd (shown in /proc/PID/fd and /proc/PID/maps);
	// default "crescent-mempool".
	Name string
	// AllowOvercommit skips the check that the arena fits in the memory
	// available (see Available): without it New refuses, with
	// ErrNotEnoughMemory, a pool that would drive the host or the
	// process's cgroup into the OOM killer when prefaulted or touched.
	AllowOvercommit bool
}

type slabState uint8

const (
	slabFree      slabState = iota // unused
	slabSmall                      // serves requests <= SlabSize through its allocator
	slabLarge                      // first slab of a multi-slab allocation
	slabLargeTail                  // later slab of a multi-slab allocation
)

type slab struct {
	mu sync.Mutex
	// state is written with both Pool.mu and mu held, read with either.
	state slabState
	// maxAlloc mirrors a.MaxAlloc() for small slabs and is 0 otherwise; a
	// lock-free hint for the fast path.
	maxAlloc atomic.Uint64

	// Guarded by mu, small slabs only.
	a         *offalloc.Allocator
	tab       table
	counts    []int32 // live allocations per size class
	live      int
	requested int64

	// Guarded by Pool.mu, slabLarge only.
	largeSlabs int
	largeLen   int64

	_ [64]byte // keep neighbouring slabs' locks off one cache line
}

// Pool is a slab memory pool over one memfd arena. All methods are safe for
// concurrent use.
type Pool struct {
	ar        *arena
	mem       []byte
	base      uintptr
	name      string
	slabSize  int64
	slabShift uint
	classes   int // size classes that fit in a slab
	slabs     []slab
	hints     []atomic.Int32 // per class: slab that last served it
	closed    atomic.Bool

	mu         sync.Mutex   // slab state transitions; order: mu, then slab locks by index
	held       []int        // scratch for allocSlow, guarded by mu
	smallSlabs atomic.Int32 // slabs in slabSmall state; written under mu
}

// New creates a pool. The arena is prefaulted unless opts.NoPrefault.
func New(opts Options) (*Pool, error) {
	slabSize := opts.SlabSize
	if slabSize == 0 {
		slabSize = DefaultSlabSize
	}
	if slabSize < MinSlabSize || slabSize > MaxSlabSize || slabSize&(slabSize-1) != 0 {
		return nil, fmt.Errorf("%w: slab size %d (want a power of two in [%d, %d])", ErrInvalidSize, slabSize, MinSlabSize, MaxSlabSize)
	}
	if opts.Size <= 0 || opts.Size > maxArena {
		return nil, fmt.Errorf("%w: pool size %d", ErrInvalidSize, opts.Size)
	}
	name := opts.Name
	if name == "" {
		name = "crescent-mempool"
	}
	check := func(size int64) error {
		if opts.AllowOvercommit {
			return nil
		}
		if err := CheckAvailable("pool", size); err != nil {
			return fmt.Errorf("%w (Options.AllowOvercommit creates it anyway)", err)
		}
		return nil
	}
	ar, err := newArena(name, roundUp(opts.Size, slabSize), slabSize, opts.HugePages, !opts.NoPrefault, check)
	if err != nil {
		return nil, err
	}
	n := len(ar.mem) / int(slabSize)
	classes := offalloc.Class(uint64(slabSize)) + 1
	p := &Pool{
		ar:        ar,
		mem:       ar.mem,
		base:      uintptr(unsafe.Pointer(unsafe.SliceData(ar.mem))),
		name:      name,
		slabSize:  slabSize,
		slabShift: uint(bits.TrailingZeros64(uint64(slabSize))),
		classes:   classes,
		slabs:     make([]slab, n),
		hints:     make([]atomic.Int32, classes),
		held:      make([]int, 0, n),
	}
	register(p)
	return p, nil
}

// maxArena keeps slab counts and offsets comfortably inside int.
const maxArena = 1 << 46

// Alloc returns n bytes (len and cap n) from the pool, aligned to at least
// 64 bytes; when n rounds up to a multiple of 4096 (n >= 4096) the slice is
// page aligned whenever a page-aligned range is free. Requests up to the
// slab size are served inside a slab and reserve n rounded up to its size
// class; larger ones take whole contiguous slabs. Contents are unspecified.
// It returns ErrOutOfMemory only if, at one instant, no slab could hold the
// request.
func (p *Pool) Alloc(n int) ([]byte, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	if n <= 0 {
		return nil, fmt.Errorf("%w: Alloc(%d)", ErrInvalidSize, n)
	}
	if int64(n) > p.slabSize {
		return p.allocLarge(n)
	}
	r := offalloc.RoundUp(uint64(n), Alignment)
	page := r%pageAlign == 0
	c := offalloc.Class(r)
	b, err := p.allocFast(n, r, c, page)
	if b != nil || err != nil {
		return b, err
	}
	return p.allocSlow(n, r, c, page)
}

// allocFast tries the small slabs whose published maxAlloc admits r,
// starting at the class's hint; busy slabs are skipped on the first pass so
// concurrent callers spread over slabs, and waited for on the second.
func (p *Pool) allocFast(n int, r uint64, c int, page bool) ([]byte, error) {
	ns := len(p.slabs)
	start := int(p.hints[c].Load())
	busy := false
	for pass := 0; pass < 2; pass++ {
		full := false // a slab before s could not hold the request
		for i := range ns {
			s := start + i
			if s >= ns {
				s -= ns
			}
			sl := &p.slabs[s]
			if sl.maxAlloc.Load() < r {
				full = true
				continue
			}
			if pass == 0 {
				if !sl.mu.TryLock() {
					busy = true
					continue
				}
			} else {
				sl.mu.Lock()
			}
			b, err := p.allocIn(s, n, r, c, page)
			sl.mu.Unlock()
			if b != nil {
				// Move the hint past slabs that are full, not past slabs
				// that were merely busy: contending goroutines then keep
				// one shared starting point and spread by skipping.
				if full && s != start {
					p.hints[c].Store(int32(s))
				}
				return b, nil
			}
			if err != nil {
				return nil, err
			}
			full = true
		}
		if !busy {
			break
		}
		if pass == 0 {
			// Every slab that could serve the request is busy: open another
			// slab rather than queue, up to one per P.
			if b, err := p.allocSpread(n, r, c, page); b != nil || err != nil {
				return b, err
			}
		}
	}
	return nil, nil
}

// allocSpread opens a free slab for a request whose candidate slabs are all
// locked by other goroutines, if the pool lock is free and fewer than
// GOMAXPROCS and a quarter of all slabs are open (so spreading never eats
// much of the room multi-slab allocations need). (nil, nil) means it did
// not.
func (p *Pool) allocSpread(n int, r uint64, c int, page bool) ([]byte, error) {
	if !p.maySpread() || !p.mu.TryLock() {
		return nil, nil
	}
	defer p.mu.Unlock()
	if p.closed.Load() || !p.maySpread() {
		return nil, nil
	}
	return p.openSlab(n, r, c, page)
}

func (p *Pool) maySpread() bool {
	open := int(p.smallSlabs.Load())
	return open < runtime.GOMAXPROCS(0) && open < len(p.slabs)/4
}

// allocSlow runs under the pool lock. It locks every small slab in index
// order and tries each, keeping the locks, then opens a free slab: when it
// returns ErrOutOfMemory all small slabs are locked and full and no slab is
// free, so the failure is real at that instant.
func (p *Pool) allocSlow(n int, r uint64, c int, page bool) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil, ErrClosed
	}
	held := p.held[:0]
	defer func() {
		for _, s := range held {
			p.slabs[s].mu.Unlock()
		}
	}()
	for s := range p.slabs {
		sl := &p.slabs[s]
		if sl.state != slabSmall {
			continue
		}
		sl.mu.Lock()
		held = append(held, s)
		b, err := p.allocIn(s, n, r, c, page)
		if err != nil {
			return nil, err // closed meanwhile
		}
		if b != nil {
			p.hints[c].Store(int32(s))
			return b, nil
		}
	}
	b, err := p.openSlab(n, r, c, page)
	if b == nil && err == nil {
		err = fmt.Errorf("%w: no slab can hold %d bytes", ErrOutOfMemory, n)
	}
	return b, err
}

// openSlab opens the highest free slab and allocates in it; p.mu held.
// Multi-slab allocations fill from the bottom, so runs of free slabs stay
// long. (nil, nil) means no slab is free.
func (p *Pool) openSlab(n int, r uint64, c int, page bool) ([]byte, error) {
	for s := len(p.slabs) - 1; s >= 0; s-- {
		sl := &p.slabs[s]
		if sl.state != slabFree {
			continue
		}
		sl.mu.Lock()
		defer sl.mu.Unlock()
		if err := p.makeSmall(sl); err != nil {
			return nil, err
		}
		b, err := p.allocIn(s, n, r, c, page)
		if err != nil {
			return nil, err
		}
		if b == nil {
			return nil, fmt.Errorf("mempool: internal error: empty slab %d refused %d bytes", s, n)
		}
		p.hints[c].Store(int32(s))
		return b, nil
	}
	return nil, nil
}

// makeSmall turns a free slab into a small one; p.mu and sl.mu held.
func (p *Pool) makeSmall(sl *slab) error {
	if sl.a == nil {
		a, err := offalloc.New(uint64(p.slabSize), offalloc.WithAlignment(Alignment), offalloc.WithCapacity(64))
		if err != nil {
			return fmt.Errorf("mempool: slab allocator: %w", err)
		}
		sl.a = a
		sl.counts = make([]int32, p.classes)
	}
	sl.state = slabSmall
	p.smallSlabs.Add(1)
	sl.maxAlloc.Store(sl.a.MaxAlloc())
	return nil
}

// allocIn allocates inside small slab s; sl.mu held. It returns (nil, nil)
// when the slab cannot hold the request.
func (p *Pool) allocIn(s, n int, r uint64, c int, page bool) ([]byte, error) {
	sl := &p.slabs[s]
	if p.closed.Load() {
		return nil, ErrClosed
	}
	if sl.state != slabSmall {
		return nil, nil
	}
	var al offalloc.Allocation
	var err error
	if page {
		al, err = sl.a.AllocAligned(r, pageAlign)
	}
	if !page || err != nil {
		if al, err = sl.a.Alloc(r); err != nil {
			return nil, nil
		}
	}
	sl.tab.put(uint32(al.Offset/Alignment)+1, uint32(n), al.Handle)
	sl.counts[c]++
	sl.live++
	sl.requested += int64(n)
	sl.maxAlloc.Store(sl.a.MaxAlloc())
	off := int64(s)<<p.slabShift + int64(al.Offset)
	return p.mem[off : off+int64(n) : off+int64(n)], nil
}

// allocLarge gives n > SlabSize bytes whole contiguous slabs, first fit
// from the bottom. Free slabs and empty small slabs qualify.
func (p *Pool) allocLarge(n int) ([]byte, error) {
	k := int((int64(n)-1)>>p.slabShift + 1) // n > 0, so this cannot overflow
	if k > len(p.slabs) {
		return nil, fmt.Errorf("%w: %d bytes exceed the pool's %d", ErrOutOfMemory, n, len(p.mem))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil, ErrClosed
	}
	p.lockAll()
	defer p.unlockAll()
	run := 0
	for s := range p.slabs {
		sl := &p.slabs[s]
		if sl.state == slabFree || sl.state == slabSmall && sl.live == 0 {
			run++
		} else {
			run = 0
		}
		if run < k {
			continue
		}
		first := s - k + 1
		for j := first; j <= s; j++ {
			if p.slabs[j].state == slabSmall {
				p.smallSlabs.Add(-1)
			}
			p.slabs[j].state = slabLargeTail
			p.slabs[j].maxAlloc.Store(0)
		}
		head := &p.slabs[first]
		head.state = slabLarge
		head.largeSlabs = k
		head.largeLen = int64(n)
		off := int64(first) << p.slabShift
		return p.mem[off : off+int64(n) : off+int64(n)], nil
	}
	return nil, fmt.Errorf("%w: no run of %d free slabs for %d bytes", ErrOutOfMemory, k, n)
}

func (p *Pool) lockAll() {
	for s := range p.slabs {
		p.slabs[s].mu.Lock()
	}
}

func (p *Pool) unlockAll() {
	for s := range p.slabs {
		p.slabs[s].mu.Unlock()
	}
}

// Free returns b to the pool. b must be exactly a slice returned by Alloc
// (same pointer, length and capacity) and not freed since; anything else
// gets ErrNotAllocated and changes nothing.
func (p *Pool) Free(b []byte) error {
	if p.closed.Load() {
		return ErrClosed
	}
	n := len(b)
	if n == 0 || cap(b) != n {
		return fmt.Errorf("%w: len %d cap %d is not a slice returned by Alloc", ErrNotAllocated, n, cap(b))
	}
	off, ok := p.Offset(b)
	if !ok {
		return fmt.Errorf("%w: %p is outside the pool", ErrNotAllocated, unsafe.SliceData(b))
	}
	s := int(off >> p.slabShift)
	sl := &p.slabs[s]
	sl.mu.Lock()
	if p.closed.Load() {
		sl.mu.Unlock()
		return ErrClosed
	}
	switch sl.state {
	case slabSmall:
		err := p.freeIn(s, uint64(off-int64(s)<<p.slabShift), n)
		sl.mu.Unlock()
		return err
	case slabLarge, slabLargeTail:
		sl.mu.Unlock()
		return p.freeLarge(s, off, n)
	}
	sl.mu.Unlock()
	return fmt.Errorf("%w: offset %d lies in an unused slab", ErrNotAllocated, off)
}

// freeIn frees the allocation at offset so of small slab s, length n;
// the slab's lock is held.
func (p *Pool) freeIn(s int, so uint64, n int) error {
	sl := &p.slabs[s]
	i := -1
	if so%Alignment == 0 {
		i = sl.tab.find(uint32(so/Alignment) + 1)
	}
	if i < 0 {
		return fmt.Errorf("%w: no allocation starts at slab offset %d", ErrNotAllocated, so)
	}
	if e := sl.tab.slots[i]; int(e.n) != n {
		return fmt.Errorf("%w: length %d, allocated %d", ErrNotAllocated, n, e.n)
	}
	r := offalloc.RoundUp(uint64(n), Alignment)
	if invariants.Enabled {
		poison(p.mem[int64(s)<<p.slabShift+int64(so):][:r])
	}
	if err := sl.a.Free(offalloc.Allocation{Offset: so, Size: r, Handle: sl.tab.slots[i].h}); err != nil {
		return fmt.Errorf("mempool: internal error: table and allocator disagree at slab offset %d: %w", so, err)
	}
	sl.tab.remove(i)
	sl.counts[offalloc.Class(r)]--
	sl.live--
	sl.requested -= int64(n)
	sl.maxAlloc.Store(sl.a.MaxAlloc())
	return nil
}

func (p *Pool) freeLarge(s int, off int64, n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return ErrClosed
	}
	head := &p.slabs[s]
	if head.state != slabLarge || off != int64(s)<<p.slabShift || head.largeLen != int64(n) {
		return fmt.Errorf("%w: offset %d length %d is not a multi-slab allocation", ErrNotAllocated, off, n)
	}
	if invariants.Enabled {
		poison(p.mem[off : off+int64(head.largeSlabs)<<p.slabShift])
	}
	for j := s; j < s+head.largeSlabs; j++ {
		sl := &p.slabs[j]
		sl.mu.Lock()
		sl.state = slabFree
		sl.mu.Unlock()
	}
	head.largeSlabs, head.largeLen = 0, 0
	return nil
}

// Bytes returns the whole arena.
func (p *Pool) Bytes() []byte { return p.mem }

// Base returns the arena's start address.
func (p *Pool) Base() uintptr { return p.base }

// Size returns the arena's size in bytes.
func (p *Pool) Size() int64 { return int64(len(p.mem)) }

// SlabSize returns the slab size.
func (p *Pool) SlabSize() int64 { return p.slabSize }

// Fd returns the arena's memfd. The pool owns it: do not close it; dup it
// to keep it beyond Close. Another process that maps it (see Map) shares
// the pool's memory at the same offsets.
func (p *Pool) Fd() int { return p.ar.fd }

// Name returns the memfd's name.
func (p *Pool) Name() string { return p.name }

// Offset returns b's offset in the arena, and false if b does not lie
// entirely inside it.
func (p *Pool) Offset(b []byte) (int64, bool) {
	ptr := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if ptr < p.base || ptr-p.base >= uintptr(len(p.mem)) || uintptr(len(b)) > uintptr(len(p.mem))-(ptr-p.base) {
		return 0, false
	}
	return int64(ptr - p.base), true
}

// Close unmaps the arena and closes the memfd; every slice from Alloc or
// Bytes becomes invalid (using one faults). Alloc and Free then return
// ErrClosed. Close waits for Alloc and Free calls in progress; calling it
// again returns nil.
func (p *Pool) Close() error {
	if !p.closed.CompareAndSwap(false, true) {
		return nil
	}
	unregister(p)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lockAll()
	defer p.unlockAll()
	if err := p.ar.close(); err != nil {
		return fmt.Errorf("mempool: close: %w", err)
	}
	return nil
}

// ClassStats counts live allocations of one rounded size.
type ClassStats struct {
	Size   int64 // rounded size: a size class, or whole slabs for large allocations
	Allocs int64
	Bytes  int64 // Size * Allocs
}

// Stats is a snapshot of a pool. Each slab is read under its lock, so the
// figures are consistent per slab, not across slabs under concurrent use.
type Stats struct {
	Capacity     int64 // arena bytes
	SlabSize     int64
	Slabs        int
	FreeSlabs    int   // slabs with no allocation
	PartialSlabs int   // slabs serving small allocations, at least one live
	LargeSlabs   int   // slabs held by allocations larger than a slab
	Used         int64 // bytes reserved (rounded sizes, whole slabs for large)
	Requested    int64 // bytes asked for by live allocations
	Allocs       int64 // live allocations
	Classes      []ClassStats
	HugePages    HugePageMode
	HugePageNote string // what was tried and why, when huge pages were asked for
	Prefault     PrefaultMode
	Closed       bool
}

// Free returns the bytes not reserved.
func (s Stats) Free() int64 { return s.Capacity - s.Used }

// Stats returns a snapshot of the pool's counters.
func (p *Pool) Stats() Stats {
	st := Stats{
		Capacity:     int64(len(p.mem)),
		SlabSize:     p.slabSize,
		Slabs:        len(p.slabs),
		HugePages:    p.ar.huge,
		HugePageNote: p.ar.hugeNote,
		Prefault:     p.ar.prefault,
		Closed:       p.closed.Load(),
	}
	counts := make([]int64, p.classes)
	large := map[int64]int64{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.slabs {
		sl := &p.slabs[s]
		sl.mu.Lock()
		switch sl.state {
		case slabFree:
			st.FreeSlabs++
		case slabSmall:
			if sl.live == 0 {
				st.FreeSlabs++
				break
			}
			st.PartialSlabs++
			st.Allocs += int64(sl.live)
			st.Requested += sl.requested
			for c, k := range sl.counts {
				counts[c] += int64(k)
			}
		case slabLarge:
			st.LargeSlabs++
			st.Allocs++
			st.Requested += sl.largeLen
			large[int64(sl.largeSlabs)<<p.slabShift]++
		case slabLargeTail:
			st.LargeSlabs++
		}
		sl.mu.Unlock()
	}
	for c, k := range counts {
		if k > 0 {
			size := int64(offalloc.ClassSize(c))
			st.Classes = append(st.Classes, ClassStats{Size: size, Allocs: k, Bytes: size * k})
		}
	}
	for size, k := range large {
		st.Classes = append(st.Classes, ClassStats{Size: size, Allocs: k, Bytes: size * k})
	}
	sort.Slice(st.Classes, func(i, j int) bool { return st.Classes[i].Size < st.Classes[j].Size })
	for _, c := range st.Classes {
		st.Used += c.Bytes
	}
	return st
}
