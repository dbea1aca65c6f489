package offalloc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRoundUp(t *testing.T) {
	tests := []struct {
		size, align, want uint64
	}{
		{1, 64, 64},
		{64, 64, 64},
		{65, 64, 128},
		{129, 64, 192},
		{511, 64, 512},
		{577, 64, 640},
		{4096, 64, 4096},
		{4097, 64, 4608},
		{4097, 4096, 8192},
		{9 << 20, 64, 9 << 20},
		{9<<20 + 1, 64, 10 << 20},
		{15<<20 + 1, 64, 16 << 20},
		{1, 1, 1},
		{7, 1, 7},
		{17, 1, 18},
		{MaxSize, 64, MaxSize},
		{MaxSize - 1, 1, MaxSize},
	}
	for _, tt := range tests {
		if got := RoundUp(tt.size, tt.align); got != tt.want {
			t.Errorf("RoundUp(%d, %d) = %d, want %d", tt.size, tt.align, got, tt.want)
		}
	}
}

func TestRoundUpProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200000 {
		align := uint64(1) << r.IntN(13)
		size := uint64(1) + r.Uint64N(uint64(1)<<(1+r.IntN(40)))
		if i < 5000 {
			size = uint64(i + 1)
		}
		aligned := alignUp(size, align)
		got := RoundUp(size, align)
		if got < aligned || got%align != 0 {
			t.Fatalf("RoundUp(%d, %d) = %d: below %d or misaligned", size, align, got, aligned)
		}
		if float64(got-aligned) > 0.125*float64(aligned) {
			t.Fatalf("RoundUp(%d, %d) = %d wastes more than 12.5%%", size, align, got)
		}
		if c := Class(got); ClassSize(c) != got {
			t.Fatalf("class of rounded size %d is %d of size %d", got, c, ClassSize(c))
		}
		if RoundUp(got, align) != got {
			t.Fatalf("RoundUp not idempotent at %d", got)
		}
	}
	last := uint64(0)
	for c := 1; c <= Class(MaxSize); c++ {
		s := ClassSize(c)
		if s <= last || Class(s) != c || binDown(s) != uint32(c) || binDown(ClassSize(c+1)-1) != uint32(c) {
			t.Fatalf("class %d size %d (prev %d) inconsistent", c, s, last)
		}
		last = s
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name string
		size uint64
		opts []Option
		want error
	}{
		{"zero", 0, nil, ErrInvalidSize},
		{"below alignment", 63, nil, ErrInvalidSize},
		{"too large", MaxSize + 1, nil, ErrInvalidSize},
		{"alignment not power of two", 1 << 20, []Option{WithAlignment(96)}, ErrInvalidAlignment},
		{"alignment zero", 1 << 20, []Option{WithAlignment(0)}, ErrInvalidAlignment},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.size, tt.opts...); !errors.Is(err, tt.want) {
				t.Fatalf("New = %v, want %v", err, tt.want)
			}
		})
	}
	a, err := New(1000)
	if err != nil {
		t.Fatal(err)
	}
	if a.Size() != 960 || a.Stats().Free != 960 {
		t.Fatalf("size %d free %d, want 960 (rounded down to 64)", a.Size(), a.Stats().Free)
	}
}

func TestAllocErrors(t *testing.T) {
	a := mustNew(t, 1<<20)
	if _, err := a.Alloc(0); !errors.Is(err, ErrInvalidSize) {
		t.Errorf("Alloc(0) = %v", err)
	}
	if _, err := a.Alloc(1<<20 + 1); !errors.Is(err, ErrNoSpace) {
		t.Errorf("Alloc(size+1) = %v", err)
	}
	if _, err := a.AllocAligned(64, 3); !errors.Is(err, ErrInvalidAlignment) {
		t.Errorf("AllocAligned(align 3) = %v", err)
	}
	if _, err := a.AllocAligned(0, 4096); !errors.Is(err, ErrInvalidSize) {
		t.Errorf("AllocAligned(0) = %v", err)
	}
	full, err := a.Alloc(1 << 20)
	if err != nil || full.Offset != 0 || full.Size != 1<<20 {
		t.Fatalf("Alloc(whole) = %+v, %v", full, err)
	}
	if _, err := a.Alloc(1); !errors.Is(err, ErrNoSpace) {
		t.Errorf("Alloc on full = %v", err)
	}
	if a.MaxAlloc() != 0 {
		t.Errorf("MaxAlloc on full = %d", a.MaxAlloc())
	}
	mustValidate(t, a)
}

func TestFreeRejectsBadHandles(t *testing.T) {
	a := mustNew(t, 1<<20)
	b := mustNew(t, 1<<20)
	x, _ := a.Alloc(100)
	y, _ := a.Alloc(100)
	bx, _ := b.Alloc(100) // same node index and offset as x in a fresh allocator
	before := a.Stats()

	tests := []struct {
		name string
		al   Allocation
	}{
		{"zero", Allocation{}},
		{"foreign", bx},
		{"offset changed", Allocation{Offset: x.Offset + 64, Size: x.Size, Handle: x.Handle}},
		{"size changed", Allocation{Offset: x.Offset, Size: x.Size + 64, Handle: x.Handle}},
		{"node out of range", Allocation{Offset: x.Offset, Size: x.Size, Handle: Handle{node: 1 << 30, gen: x.Handle.gen}}},
		{"other's handle", Allocation{Offset: x.Offset, Size: x.Size, Handle: y.Handle}},
	}
	for _, tt := range tests {
		if err := a.Free(tt.al); !errors.Is(err, ErrNotAllocated) {
			t.Errorf("%s: Free = %v, want ErrNotAllocated", tt.name, err)
		}
	}
	if a.Stats() != before {
		t.Fatalf("rejected frees changed state: %+v -> %+v", before, a.Stats())
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(x); !errors.Is(err, ErrNotAllocated) {
		t.Fatalf("double free = %v", err)
	}
	// Reuse the same node for a new allocation at the same offset: the stale
	// handle must still be rejected.
	x2, _ := a.Alloc(100)
	if x2.Offset != x.Offset || x2.Handle.node != x.Handle.node {
		t.Logf("node not reused (offset %d node %d); stale check is weaker", x2.Offset, x2.Handle.node)
	}
	if err := a.Free(x); !errors.Is(err, ErrNotAllocated) {
		t.Fatalf("stale free = %v", err)
	}
	for _, al := range []Allocation{x2, y} {
		if err := a.Free(al); err != nil {
			t.Fatal(err)
		}
	}
	mustValidate(t, a)
	if s := a.Stats(); s.FreeRanges != 1 || s.Free != 1<<20 || s.Allocs != 0 {
		t.Fatalf("after freeing everything: %+v", s)
	}
}

func TestExhaustion(t *testing.T) {
	const size = 256 << 10
	for _, align := range []uint64{1, 64, 4096} {
		a := mustNew(t, size, WithAlignment(align))
		var all []Allocation
		for {
			al, err := a.Alloc(1)
			if errors.Is(err, ErrNoSpace) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if al.Size != align || al.Offset%align != 0 {
				t.Fatalf("align %d: got %+v", align, al)
			}
			all = append(all, al)
		}
		if uint64(len(all)) != size/align {
			t.Fatalf("align %d: %d allocations, want %d", align, len(all), size/align)
		}
		mustValidate(t, a)
		// Free in a shuffled order; everything must coalesce into one range.
		rand.New(rand.NewPCG(uint64(align), 9)).Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		for _, al := range all {
			if err := a.Free(al); err != nil {
				t.Fatal(err)
			}
		}
		mustValidate(t, a)
		if s := a.Stats(); s.FreeRanges != 1 || s.LargestFree != size || a.MaxAlloc() != size {
			t.Fatalf("align %d: not coalesced: %+v max %d", align, s, a.MaxAlloc())
		}
	}
}

func TestFragmentation(t *testing.T) {
	const size, block = 1 << 20, 4096
	a := mustNew(t, size)
	var blocks []Allocation
	for range size / block {
		al, err := a.Alloc(block)
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, al)
	}
	// Free every other block: half the space is free but no range exceeds
	// one block.
	for i := 0; i < len(blocks); i += 2 {
		if err := a.Free(blocks[i]); err != nil {
			t.Fatal(err)
		}
	}
	s := a.Stats()
	if s.Free != size/2 || s.LargestFree != block || s.FreeRanges != len(blocks)/2 || a.MaxAlloc() != block {
		t.Fatalf("checkerboard: %+v max %d", s, a.MaxAlloc())
	}
	if _, err := a.Alloc(block + 1); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Alloc(block+1) in checkerboard = %v", err)
	}
	// Small allocations still fit in the holes and do not disturb
	// neighbours.
	small, err := a.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(small); err != nil {
		t.Fatal(err)
	}
	// Freeing one used block merges three ranges into one of 3 blocks.
	if err := a.Free(blocks[1]); err != nil {
		t.Fatal(err)
	}
	if got := a.Stats().LargestFree; got != 3*block {
		t.Fatalf("after merge LargestFree = %d, want %d", got, 3*block)
	}
	al, err := a.Alloc(3 * block)
	if err != nil || al.Offset != 0 {
		t.Fatalf("Alloc(3 blocks) = %+v, %v; want offset 0", al, err)
	}
	mustValidate(t, a)
}

func TestAllocAligned(t *testing.T) {
	a := mustNew(t, 1<<20)
	small, _ := a.Alloc(64)
	got, err := a.AllocAligned(8192, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if got.Offset%4096 != 0 || got.Size != 8192 {
		t.Fatalf("AllocAligned = %+v", got)
	}
	// The padding in front stays free and usable.
	pad, err := a.Alloc(64)
	if err != nil || pad.Offset != 64 {
		t.Fatalf("padding not reused: %+v %v", pad, err)
	}
	for _, al := range []Allocation{small, got, pad} {
		if err := a.Free(al); err != nil {
			t.Fatal(err)
		}
	}
	mustValidate(t, a)
	// A request as large as the whole space with an alignment the offset
	// already has succeeds even though size+padding would not fit.
	whole, err := a.AllocAligned(1<<20, 1<<20)
	if err != nil || whole.Offset != 0 {
		t.Fatalf("AllocAligned(whole) = %+v, %v", whole, err)
	}
	if err := a.Free(whole); err != nil {
		t.Fatal(err)
	}
	// Alignments at most the allocator's own are plain Alloc.
	x, err := a.AllocAligned(10, 16)
	if err != nil || x.Size != 64 {
		t.Fatalf("AllocAligned(small align) = %+v, %v", x, err)
	}
}

// model is the reference: a plain list of live ranges.
type model struct {
	size uint64
	live map[Handle]Allocation
}

func (m *model) sorted() []Allocation {
	s := make([]Allocation, 0, len(m.live))
	for _, al := range m.live {
		s = append(s, al)
	}
	slices.SortFunc(s, func(x, y Allocation) int {
		if x.Offset < y.Offset {
			return -1
		}
		if x.Offset > y.Offset {
			return 1
		}
		return 0
	})
	return s
}

// maxGap is the longest free range; it also checks that live ranges do
// not overlap.
func (m *model) maxGap() (uint64, error) {
	var gap, off uint64
	for _, al := range m.sorted() {
		if al.Offset < off {
			return 0, errors.New("overlapping allocations")
		}
		gap = max(gap, al.Offset-off)
		off = al.Offset + al.Size
	}
	if off > m.size {
		return 0, errors.New("allocation beyond the end")
	}
	return max(gap, m.size-off), nil
}

type op struct {
	kind  byte // 0 alloc, 1 free, 2 aligned alloc
	size  uint64
	pick  int
	align uint64
}

// runOps applies ops to a and the model and checks every result.
func runOps(a *Allocator, ops []op) error {
	m := &model{size: a.Size(), live: map[Handle]Allocation{}}
	var order []Handle
	for _, o := range ops {
		switch o.kind {
		case 0, 2:
			if o.size == 0 || o.size > a.Size() {
				continue
			}
			gapBefore, err := m.maxGap()
			if err != nil {
				return err
			}
			maxBefore := a.MaxAlloc()
			r := a.RoundUp(o.size)
			var al Allocation
			if o.kind == 0 {
				al, err = a.Alloc(o.size)
			} else {
				al, err = a.AllocAligned(o.size, o.align)
			}
			if o.kind == 0 {
				if (err == nil) != (r <= gapBefore) || (err == nil) != (r <= maxBefore) {
					return fmt.Errorf("Alloc(%d) rounded %d: err %v, model gap %d, MaxAlloc %d", o.size, r, err, gapBefore, maxBefore)
				}
			} else if err == nil && al.Offset%max(o.align, a.Alignment()) != 0 {
				return fmt.Errorf("AllocAligned(%d, %d) = %+v: misaligned", o.size, o.align, al)
			}
			if err != nil {
				if !errors.Is(err, ErrNoSpace) {
					return err
				}
				continue
			}
			if al.Size != r || al.Offset%a.Alignment() != 0 {
				return fmt.Errorf("Alloc(%d) = %+v, want size %d", o.size, al, r)
			}
			m.live[al.Handle] = al
			order = append(order, al.Handle)
			if _, err := m.maxGap(); err != nil {
				return fmt.Errorf("after Alloc(%d) = %+v: %v", o.size, al, err)
			}
		case 1:
			if len(order) == 0 {
				continue
			}
			i := o.pick % len(order)
			h := order[i]
			order[i] = order[len(order)-1]
			order = order[:len(order)-1]
			al := m.live[h]
			delete(m.live, h)
			if err := a.Free(al); err != nil {
				return fmt.Errorf("Free(%+v): %v", al, err)
			}
			if err := a.Free(al); !errors.Is(err, ErrNotAllocated) {
				return fmt.Errorf("double Free(%+v) = %v", al, err)
			}
		}
		s := a.Stats()
		var used uint64
		for _, al := range m.live {
			used += al.Size
		}
		if s.Allocs != len(m.live) || s.Free != a.Size()-used {
			return fmt.Errorf("stats %+v, model has %d allocs using %d", s, len(m.live), used)
		}
	}
	if err := a.validate(); err != nil {
		return err
	}
	for _, h := range order {
		if err := a.Free(m.live[h]); err != nil {
			return err
		}
	}
	if err := a.validate(); err != nil {
		return err
	}
	if s := a.Stats(); s.FreeRanges != 1 || s.LargestFree != a.Size() || s.Allocs != 0 {
		return fmt.Errorf("not fully coalesced: %+v", s)
	}
	return nil
}

func TestRandomAgainstModel(t *testing.T) {
	for seed := range uint64(8) {
		r := rand.New(rand.NewPCG(seed, 77))
		size := uint64(1) << (16 + r.IntN(8))
		align := uint64(1) << r.IntN(8)
		a := mustNew(t, size, WithAlignment(align), WithCapacity(r.IntN(4)))
		ops := make([]op, 3000)
		for i := range ops {
			o := op{kind: byte(r.IntN(2)), pick: r.IntN(1 << 20)}
			if r.IntN(10) == 0 {
				o.kind = 2
				o.align = uint64(1) << r.IntN(14)
			}
			// Mostly small sizes, sometimes large ones.
			o.size = 1 + r.Uint64N(size>>uint(4+r.IntN(10)))
			ops[i] = o
		}
		if err := runOps(a, ops); err != nil {
			t.Fatalf("seed %d (size %d align %d): %v", seed, size, align, err)
		}
	}
}

func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 10, 0, 0, 1, 0, 0, 0})
	f.Add([]byte{0, 255, 255, 3, 0, 1, 0, 0, 2, 8, 0, 12, 1, 0, 0, 0, 1, 1, 0, 0})
	f.Add([]byte{6, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1 {
			return
		}
		align := uint64(1) << (data[0] % 10)
		a, err := New(1<<20, WithAlignment(align), WithCapacity(1))
		if err != nil {
			t.Fatal(err)
		}
		data = data[1:]
		var ops []op
		for len(data) >= 4 {
			o := op{kind: data[0] % 3, pick: int(data[1])}
			o.size = uint64(data[1]) | uint64(data[2])<<8 | uint64(data[3]&0x1f)<<16
			o.align = uint64(1) << (data[3] >> 3 & 0x1f % 21)
			ops = append(ops, o)
			data = data[4:]
		}
		if err := runOps(a, ops); err != nil {
			t.Fatal(err)
		}
	})
}

func TestSteadyStateAllocations(t *testing.T) {
	a := mustNew(t, 1<<30)
	// Background allocations so the measured path splits and coalesces.
	var bg []Allocation
	for i := range 1000 {
		al, err := a.Alloc(uint64(64 + i*64))
		if err != nil {
			t.Fatal(err)
		}
		bg = append(bg, al)
	}
	for i := 0; i < len(bg); i += 3 {
		_ = a.Free(bg[i])
	}
	sizes := []uint64{64, 4096, 1 << 20, 100000}
	n := testing.AllocsPerRun(1000, func() {
		for _, s := range sizes {
			al, err := a.Alloc(s)
			if err != nil {
				panic(err)
			}
			if err := a.Free(al); err != nil {
				panic(err)
			}
		}
	})
	if n != 0 {
		t.Fatalf("Alloc+Free allocates %.1f times per run, want 0", n)
	}
	mustValidate(t, a)
}

func TestLargeAddressSpace(t *testing.T) {
	a := mustNew(t, 1<<40) // 1 TiB: offsets beyond 32 bits
	var all []Allocation
	for range 64 {
		al, err := a.Alloc(15 << 30)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, al)
	}
	if last := all[len(all)-1]; last.Offset+last.Size <= 1<<32 {
		t.Fatalf("offsets did not exceed 32 bits: %+v", last)
	}
	for _, al := range all {
		if err := a.Free(al); err != nil {
			t.Fatal(err)
		}
	}
	mustValidate(t, a)
}

func mustNew(t testing.TB, size uint64, opts ...Option) *Allocator {
	t.Helper()
	a, err := New(size, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustValidate(t testing.TB, a *Allocator) {
	t.Helper()
	if err := a.validate(); err != nil {
		t.Fatal(err)
	}
}

// TestNodeTableGrowth: the node table grows by an eighth, so it never
// holds much more than the ranges it has needed (it was doubled: up to
// half of it unused, most of a store master's memory per object).
func TestNodeTableGrowth(t *testing.T) {
	a := mustNew(t, 1<<40)
	for i := range 200_000 {
		if _, err := a.Alloc(4096); err != nil {
			t.Fatal(err)
		}
		if n := a.Stats().Nodes; n > (i+2)*9/8+16 {
			t.Fatalf("%d nodes for %d ranges", n, i+2)
		}
	}
}

// TestNodeTableGrowthCopiesOneChunk: growing a large node table allocates
// the new nodes and at most one partial chunk, never a copy of the whole
// table (a store master's allocator has millions of ranges; copying them
// on each growth was 8.5% of its CPU).
func TestNodeTableGrowthCopiesOneChunk(t *testing.T) {
	a := mustNew(t, 1<<40)
	nodeSize := uint64(unsafe.Sizeof(node{}))
	var ms runtime.MemStats
	grown := 0
	for range 300_000 {
		if a.spare >= 2 {
			_, err := a.Alloc(4096)
			require.NoError(t, err)
			continue
		}
		before := uint64(a.Stats().Nodes)
		runtime.ReadMemStats(&ms)
		start := ms.TotalAlloc
		_, err := a.Alloc(4096)
		require.NoError(t, err)
		runtime.ReadMemStats(&ms)
		added := uint64(a.Stats().Nodes) - before
		require.Positive(t, added)
		if before > 2*chunkLen {
			grown++
			assert.LessOrEqual(t, ms.TotalAlloc-start, (added+chunkLen)*nodeSize+64<<10,
				"growing %d nodes by %d", before, added)
		}
	}
	require.Positive(t, grown)
}
