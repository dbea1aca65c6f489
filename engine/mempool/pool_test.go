package mempool

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/crescent-kv/crescent/internal/offalloc"
)

func TestNewOptions(t *testing.T) {
	tests := []struct {
		name      string
		opts      Options
		err       error
		size      int64
		slabSize  int64
		wantSlabs int
	}{
		{name: "zero size", opts: Options{}, err: ErrInvalidSize},
		{name: "negative size", opts: Options{Size: -1}, err: ErrInvalidSize},
		{name: "slab not power of two", opts: Options{Size: 1 << 20, SlabSize: 3 << 16}, err: ErrInvalidSize},
		{name: "slab too small", opts: Options{Size: 1 << 20, SlabSize: 32 << 10}, err: ErrInvalidSize},
		{name: "slab too large", opts: Options{Size: 1 << 20, SlabSize: 2 << 30}, err: ErrInvalidSize},
		{name: "default slab rounds size up", opts: Options{Size: 1, NoPrefault: true}, size: 16 << 20, slabSize: 16 << 20, wantSlabs: 1},
		{name: "rounded to slabs", opts: Options{Size: 3<<20 + 1, SlabSize: 1 << 20}, size: 4 << 20, slabSize: 1 << 20, wantSlabs: 4},
		{name: "no prefault", opts: Options{Size: 1 << 20, SlabSize: 1 << 20, NoPrefault: true}, size: 1 << 20, slabSize: 1 << 20, wantSlabs: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(tt.opts)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("New = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			st := p.Stats()
			if p.Size() != tt.size || st.Capacity != tt.size || st.SlabSize != tt.slabSize || st.Slabs != tt.wantSlabs || st.FreeSlabs != tt.wantSlabs {
				t.Fatalf("size %d stats %+v", p.Size(), st)
			}
			if tt.opts.NoPrefault && st.Prefault != PrefaultNone || !tt.opts.NoPrefault && st.Prefault == PrefaultNone {
				t.Fatalf("prefault mode %v with NoPrefault=%v", st.Prefault, tt.opts.NoPrefault)
			}
			if len(p.Bytes()) != int(tt.size) || p.Base() != uintptr(unsafe.Pointer(&p.Bytes()[0])) || p.Name() != "crescent-mempool" {
				t.Fatalf("Bytes/Base/Name inconsistent")
			}
		})
	}
}

func TestAllocShapes(t *testing.T) {
	const slab = 1 << 20
	p := newPool(t, Options{Size: 4 * slab, SlabSize: slab})
	tests := []struct {
		n       int
		rounded int64
		align   uintptr
	}{
		{1, 64, 64},
		{64, 64, 64},
		{100, 128, 64},
		{4096, 4096, 4096},
		{5000, 5120, 64}, // rounded size not a page multiple: 64-byte aligned
		{12288, 12288, 4096},
		{65536, 65536, 4096},
		{100000, 106496, 4096},
		{slab, slab, 4096},
		{slab + 1, 2 * slab, 4096},
		{3 * slab, 3 * slab, 4096},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.n), func(t *testing.T) {
			b, err := p.Alloc(tt.n)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != tt.n || cap(b) != tt.n {
				t.Fatalf("len %d cap %d", len(b), cap(b))
			}
			if a := uintptr(unsafe.Pointer(&b[0])); a%tt.align != 0 {
				t.Fatalf("address %#x not %d-aligned", a, tt.align)
			}
			off, ok := p.Offset(b)
			if !ok || &p.Bytes()[off] != &b[0] {
				t.Fatalf("Offset = %d, %v", off, ok)
			}
			st := p.Stats()
			if st.Used != tt.rounded || st.Requested != int64(tt.n) || st.Allocs != 1 ||
				len(st.Classes) != 1 || st.Classes[0] != (ClassStats{Size: tt.rounded, Allocs: 1, Bytes: tt.rounded}) {
				t.Fatalf("stats %+v", st)
			}
			for i := range b {
				b[i] = byte(i)
			}
			if err := p.Free(b); err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.Used != 0 || st.Allocs != 0 || st.FreeSlabs != st.Slabs || len(st.Classes) != 0 {
				t.Fatalf("after free: %+v", st)
			}
		})
	}
	if _, err := p.Alloc(0); !errors.Is(err, ErrInvalidSize) {
		t.Fatalf("Alloc(0) = %v", err)
	}
	if _, err := p.Alloc(-5); !errors.Is(err, ErrInvalidSize) {
		t.Fatalf("Alloc(-5) = %v", err)
	}
}

func TestFreeRejects(t *testing.T) {
	const slab = 1 << 20
	p := newPool(t, Options{Size: 4 * slab, SlabSize: slab})
	other := newPool(t, Options{Size: slab, SlabSize: slab})
	b, _ := p.Alloc(1000)
	large, _ := p.Alloc(2 * slab)
	ob, _ := other.Alloc(1000)
	heap := make([]byte, 1000)
	before := p.Stats()

	tests := []struct {
		name string
		b    []byte
	}{
		{"nil", nil},
		{"empty", b[:0]},
		{"shorter", b[:999]},
		{"shorter with cap", b[:999:999]},
		{"interior", b[64 : 64+512 : 64+512]},
		{"other pool", ob},
		{"go heap", heap},
		{"whole arena", p.Bytes()},
		{"unused slab", p.Bytes()[2*slab : 2*slab+1000 : 2*slab+1000]},
		{"large tail slab", p.Bytes()[slab : slab+1000 : slab+1000]},
		{"large shorter", large[: 2*slab-1 : 2*slab-1]},
		{"large interior", large[slab : 2*slab : 2*slab]},
	}
	for _, tt := range tests {
		if err := p.Free(tt.b); !errors.Is(err, ErrNotAllocated) {
			t.Errorf("%s: Free = %v, want ErrNotAllocated", tt.name, err)
		}
	}
	if st := p.Stats(); fmt.Sprint(st) != fmt.Sprint(before) {
		t.Fatalf("rejected frees changed stats:\n%+v\n%+v", before, st)
	}
	for _, x := range [][]byte{b, large} {
		if err := p.Free(x); err != nil {
			t.Fatal(err)
		}
		if err := p.Free(x); !errors.Is(err, ErrNotAllocated) {
			t.Fatalf("double free = %v", err)
		}
	}
	if err := other.Free(ob); err != nil {
		t.Fatal(err)
	}
}

func TestOutOfMemory(t *testing.T) {
	const slab = 1 << 20
	t.Run("one slab", func(t *testing.T) {
		p := newPool(t, Options{Size: slab, SlabSize: slab, NoPrefault: true})
		whole, err := p.Alloc(slab)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Alloc(1); !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("Alloc on full pool = %v", err)
		}
		if _, err := p.Alloc(slab + 1); !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("Alloc larger than pool = %v", err)
		}
		if err := p.Free(whole); err != nil {
			t.Fatal(err)
		}
		halves := [2][]byte{}
		for i := range halves {
			if halves[i], err = p.Alloc(slab / 2); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := p.Alloc(64); !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("Alloc after two halves = %v", err)
		}
		if err := p.Free(halves[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Alloc(slab/2 + 1); !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("Alloc(half+1) with half free = %v", err)
		}
		if _, err := p.Alloc(slab / 2); err != nil {
			t.Fatalf("Alloc(half) with half free = %v", err)
		}
	})
	t.Run("multi slab", func(t *testing.T) {
		p := newPool(t, Options{Size: 4 * slab, SlabSize: slab, NoPrefault: true})
		small, err := p.Alloc(64) // opens the top slab
		if err != nil {
			t.Fatal(err)
		}
		l1, err := p.Alloc(2 * slab) // slabs 0-1
		if err != nil {
			t.Fatal(err)
		}
		if off, _ := p.Offset(l1); off != 0 {
			t.Fatalf("large allocation at %d, want 0 (first fit from the bottom)", off)
		}
		if _, err := p.Alloc(2 * slab); !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("second 2-slab Alloc with one slab free = %v", err)
		}
		whole, err := p.Alloc(slab) // in-slab path: opens slab 2
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Alloc(slab); !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("Alloc(slab) with no empty slab = %v", err)
		}
		if _, err := p.Alloc(slab + 1); !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("Alloc(slab+1) with no free slab = %v", err)
		}
		for _, b := range [][]byte{whole, small} {
			if err := p.Free(b); err != nil {
				t.Fatal(err)
			}
		}
		// The emptied small slabs can now be taken whole.
		l3, err := p.Alloc(slab + 1)
		if err != nil {
			t.Fatalf("Alloc over emptied small slabs: %v", err)
		}
		st := p.Stats()
		if st.LargeSlabs != 4 || st.Allocs != 2 || st.Used != 4*slab || st.Free() != 0 {
			t.Fatalf("stats %+v", st)
		}
		if err := p.Free(l1); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Alloc(4 * slab); !errors.Is(err, ErrOutOfMemory) {
			t.Fatalf("whole-pool Alloc with two slabs allocated = %v", err)
		}
		if err := p.Free(l3); err != nil {
			t.Fatal(err)
		}
		all, err := p.Alloc(4 * slab)
		if err != nil {
			t.Fatalf("whole-pool Alloc on an empty pool: %v", err)
		}
		for _, n := range []int{5 * slab, math.MaxInt} {
			if _, err := p.Alloc(n); !errors.Is(err, ErrOutOfMemory) {
				t.Fatalf("Alloc(%d) beyond capacity = %v", n, err)
			}
		}
		if err := p.Free(all); err != nil {
			t.Fatal(err)
		}
	})
}

// TestNoSpuriousOutOfMemory releases many goroutines at once on a fresh
// pool, where every request fits, and requires all to succeed; the
// overcommitted cases require exactly the surplus to fail.
func TestNoSpuriousOutOfMemory(t *testing.T) {
	const slab = 1 << 20
	tests := []struct {
		name      string
		slabs     int
		sizes     func(r *rand.Rand, g int) []int
		wantFails int
	}{
		{"1 slab, 64 x slab/64", 1, equal(64, slab/64), 0},
		{"1 slab, 65 x slab/64", 1, equal(65, slab/64), 1},
		{"1 slab, 64 mixed up to half", 1, mixed(64, slab/2), 0},
		{"1 slab, 8 x whole slab", 1, equal(8, slab), 7},
		{"4 slabs, 8 x half slab", 4, equal(8, slab/2), 0},
		{"4 slabs, 4 x whole slab", 4, equal(4, slab), 0},
		{"4 slabs, 2 x two slabs", 4, equal(2, 2*slab), 0},
		{"4 slabs, 3 x two slabs", 4, equal(3, slab+1), 1},
	}
	rounds := 100
	if testing.Short() {
		rounds = 20
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 4))
			for round := range rounds {
				p, err := New(Options{Size: int64(tt.slabs) * slab, SlabSize: slab, NoPrefault: true})
				if err != nil {
					t.Fatal(err)
				}
				sizes := tt.sizes(r, round)
				bufs := make([][]byte, len(sizes))
				errs := make([]error, len(sizes))
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i, n := range sizes {
					wg.Go(func() {
						<-start
						bufs[i], errs[i] = p.Alloc(n)
						if errs[i] == nil {
							b := bufs[i]
							b[0], b[len(b)-1] = byte(i), byte(i)
						}
					})
				}
				close(start)
				wg.Wait()
				fails := 0
				for i, err := range errs {
					switch {
					case errors.Is(err, ErrOutOfMemory):
						fails++
					case err != nil:
						t.Fatalf("round %d goroutine %d: %v", round, i, err)
					case bufs[i][0] != byte(i) || bufs[i][len(bufs[i])-1] != byte(i):
						t.Fatalf("round %d: buffer %d overwritten: overlapping allocations", round, i)
					}
				}
				if fails != tt.wantFails {
					t.Fatalf("round %d: %d of %d allocations failed, want %d (sizes %v)", round, fails, len(sizes), tt.wantFails, sizes)
				}
				for i, b := range bufs {
					if errs[i] == nil {
						if err := p.Free(b); err != nil {
							t.Fatal(err)
						}
					}
				}
				if st := p.Stats(); st.Allocs != 0 || st.Used != 0 {
					t.Fatalf("round %d: after freeing all: %+v", round, st)
				}
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func equal(g, n int) func(*rand.Rand, int) []int {
	return func(*rand.Rand, int) []int {
		s := make([]int, g)
		for i := range s {
			s[i] = n
		}
		return s
	}
}

// mixed returns g random sizes whose rounded sizes add up to at most
// budget; with at most 4 KiB of alignment padding each they always fit in
// one slab of 2*budget.
func mixed(g, budget int) func(*rand.Rand, int) []int {
	return func(r *rand.Rand, _ int) []int {
		s := make([]int, g)
		left := budget
		for i := range s {
			n := 1 + r.IntN(2*budget/g)
			if rn := int(offalloc.RoundUp(uint64(n), Alignment)); rn <= left {
				s[i] = n
				left -= rn
			} else {
				s[i] = 1
				left -= Alignment
			}
		}
		return s
	}
}

// TestConcurrentStress runs goroutines that allocate, fill, check and free
// buffers of mixed sizes (including multi-slab ones) and verifies that no
// two live buffers ever overlap and that all memory comes back.
func TestConcurrentStress(t *testing.T) {
	const slab = 256 << 10
	p := newPool(t, Options{Size: 8 * slab, SlabSize: slab})
	const workers, ops = 8, 4000
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	var allocs, larges, ooms atomic.Int64
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 5))
			var live [][]byte
			check := func(b []byte) bool {
				tag := b[0]
				for _, i := range []int{len(b) / 2, len(b) - 1} {
					if b[i] != tag {
						return false
					}
				}
				return true
			}
			fail := func(err error) {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
			for i := range ops {
				if len(live) > 0 && (len(live) >= 12 || r.IntN(2) == 0) {
					j := r.IntN(len(live))
					b := live[j]
					live[j] = live[len(live)-1]
					live = live[:len(live)-1]
					if !check(b) {
						fail(fmt.Errorf("worker %d: buffer of %d bytes overwritten", w, len(b)))
						return
					}
					if err := p.Free(b); err != nil {
						fail(err)
						return
					}
					continue
				}
				n := 1 + r.IntN(16<<10)
				switch r.IntN(20) {
				case 0:
					n = slab + r.IntN(slab)
				case 1, 2:
					n = 1 + r.IntN(slab)
				}
				b, err := p.Alloc(n)
				if errors.Is(err, ErrOutOfMemory) {
					ooms.Add(1)
					continue
				}
				if err != nil {
					fail(err)
					return
				}
				allocs.Add(1)
				if n > slab {
					larges.Add(1)
				}
				tag := byte(w<<5 ^ i)
				b[0], b[len(b)/2], b[len(b)-1] = tag, tag, tag
				live = append(live, b)
			}
			for _, b := range live {
				if !check(b) {
					fail(fmt.Errorf("worker %d: buffer overwritten", w))
				}
				if err := p.Free(b); err != nil {
					fail(err)
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	t.Logf("%d allocations (%d multi-slab), %d out of memory", allocs.Load(), larges.Load(), ooms.Load())
	if allocs.Load() < workers*ops/4 || larges.Load() == 0 {
		t.Fatalf("stress did not exercise the pool: %d allocations, %d multi-slab", allocs.Load(), larges.Load())
	}
	st := p.Stats()
	if st.Allocs != 0 || st.Used != 0 || st.Requested != 0 || st.FreeSlabs != st.Slabs {
		t.Fatalf("after all frees: %+v", st)
	}
	// Everything coalesced: the whole pool is one allocation again.
	b, err := p.Alloc(int(p.Size()))
	if err != nil {
		t.Fatalf("whole-pool Alloc after stress: %v", err)
	}
	if err := p.Free(b); err != nil {
		t.Fatal(err)
	}
}

func TestStatsClasses(t *testing.T) {
	const slab = 1 << 20
	p := newPool(t, Options{Size: 4 * slab, SlabSize: slab, NoPrefault: true})
	var bufs [][]byte
	for _, n := range []int{100, 120, 128, 4096, 4000, 5000, 2*slab + 5} {
		b, err := p.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	st := p.Stats()
	want := []ClassStats{
		{128, 3, 384},
		{4096, 2, 8192},
		{5120, 1, 5120},
		{3 * slab, 1, 3 * slab},
	}
	if fmt.Sprint(st.Classes) != fmt.Sprint(want) {
		t.Fatalf("classes %v, want %v", st.Classes, want)
	}
	if st.Used != 384+8192+5120+3*slab || st.Requested != 100+120+128+4096+4000+5000+2*slab+5 ||
		st.Allocs != 7 || st.PartialSlabs != 1 || st.LargeSlabs != 3 || st.FreeSlabs != 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, b := range bufs {
		if err := p.Free(b); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCloseAndClosed(t *testing.T) {
	before := openFds(t)
	p, err := New(Options{Size: 1 << 20, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := p.Alloc(100)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := p.Alloc(100); !errors.Is(err, ErrClosed) {
		t.Fatalf("Alloc after Close = %v", err)
	}
	if _, err := p.Alloc(4 << 20); !errors.Is(err, ErrClosed) {
		t.Fatalf("large Alloc after Close = %v", err)
	}
	if err := p.Free(b); !errors.Is(err, ErrClosed) {
		t.Fatalf("Free after Close = %v", err)
	}
	if !p.Stats().Closed {
		t.Fatal("Stats.Closed false after Close")
	}
	if _, _, _, ok := Lookup(b); ok {
		t.Fatal("Lookup finds a closed pool")
	}
	if after := openFds(t); after != before {
		t.Fatalf("open fds %d -> %d", before, after)
	}
}

// TestCloseRacesAlloc closes a pool while goroutines allocate and free;
// every call must either work or return ErrClosed.
func TestCloseRacesAlloc(t *testing.T) {
	for range 10 {
		p, err := New(Options{Size: 1 << 20, SlabSize: 256 << 10, NoPrefault: true})
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg, warm sync.WaitGroup
		errs := make(chan error, 8)
		for g := range 4 {
			warm.Add(1)
			wg.Go(func() {
				<-start
				for i := 0; ; i++ {
					if i == 100 {
						warm.Done() // Close only once every goroutine is busy
					}
					b, err := p.Alloc(64 << (i % 13))
					if errors.Is(err, ErrClosed) {
						if i < 100 {
							warm.Done()
						}
						return
					}
					if err != nil && !errors.Is(err, ErrOutOfMemory) {
						errs <- fmt.Errorf("goroutine %d: Alloc: %w", g, err)
						if i < 100 {
							warm.Done()
						}
						return
					}
					if err == nil {
						if err := p.Free(b); err != nil && !errors.Is(err, ErrClosed) {
							errs <- fmt.Errorf("goroutine %d: Free: %w", g, err)
							if i < 100 {
								warm.Done()
							}
							return
						}
					}
				}
			})
		}
		close(start)
		warm.Wait()
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
}

func TestLookup(t *testing.T) {
	const slab = 1 << 20
	p1 := newPool(t, Options{Size: 2 * slab, SlabSize: slab, NoPrefault: true})
	p2 := newPool(t, Options{Size: 2 * slab, SlabSize: slab, NoPrefault: true})
	for _, p := range []*Pool{p1, p2} {
		b, err := p.Alloc(5000)
		if err != nil {
			t.Fatal(err)
		}
		fd, off, got, ok := Lookup(b)
		want, _ := p.Offset(b)
		if !ok || got != p || fd != p.Fd() || off != want {
			t.Fatalf("Lookup = %d %d %p %v, want %d %d %p", fd, off, got, ok, p.Fd(), want, p)
		}
		if _, off, _, ok := Lookup(b[100:200]); !ok || off != want+100 {
			t.Fatalf("Lookup(sub-slice) = %d %v", off, ok)
		}
		if _, _, _, ok := Lookup(p.Bytes()[p.Size()-10:]); !ok {
			t.Fatal("Lookup of the arena's tail failed")
		}
		// A slice reaching past the arena's end is not in the pool.
		past := unsafe.Slice(&p.Bytes()[p.Size()-10], 20)
		if _, _, _, ok := Lookup(past); ok {
			t.Fatal("Lookup accepted a slice past the arena's end")
		}
	}
	if _, _, _, ok := Lookup(make([]byte, 10)); ok {
		t.Fatal("Lookup found a Go heap slice")
	}
	if _, _, _, ok := Lookup(nil); ok {
		t.Fatal("Lookup found nil")
	}
}

func TestHugePagesOption(t *testing.T) {
	p := newPool(t, Options{Size: 4 << 20, SlabSize: 2 << 20, HugePages: true})
	st := p.Stats()
	t.Logf("huge pages: %v (%s), prefault %v", st.HugePages, st.HugePageNote, st.Prefault)
	if st.HugePageNote == "" {
		t.Fatal("HugePageNote empty although huge pages were asked for")
	}
	b, err := p.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b[0], b[len(b)-1] = 1, 2
	if err := p.Free(b); err != nil {
		t.Fatal(err)
	}
	if q := newPool(t, Options{Size: 1 << 20, SlabSize: 1 << 20}); q.Stats().HugePages != HugePagesNone || q.Stats().HugePageNote != "" {
		t.Fatalf("huge pages used without being asked: %+v", q.Stats())
	}
}

func TestSteadyStateNoAllocations(t *testing.T) {
	p := newPool(t, Options{Size: 4 << 20, SlabSize: 2 << 20})
	keep, _ := p.Alloc(100) // the slab stays open
	for _, n := range []int{64, 4096, 64 << 10, 1 << 20} {
		got := testing.AllocsPerRun(200, func() {
			b, err := p.Alloc(n)
			if err != nil {
				panic(err)
			}
			if err := p.Free(b); err != nil {
				panic(err)
			}
		})
		if got != 0 {
			t.Errorf("Alloc+Free(%d): %.1f heap allocations per op, want 0", n, got)
		}
	}
	if err := p.Free(keep); err != nil {
		t.Fatal(err)
	}
}

func TestTable(t *testing.T) {
	var tab table
	ref := map[uint32]uint32{}
	r := rand.New(rand.NewPCG(7, 7))
	for i := range 200000 {
		key := 1 + uint32(r.IntN(5000))
		j := tab.find(key)
		v, ok := ref[key]
		if ok != (j >= 0) || ok && tab.slots[j].n != v {
			t.Fatalf("op %d: find(%d) = %d, ref %v %v", i, key, j, v, ok)
		}
		if ok {
			tab.remove(j)
			delete(ref, key)
		} else {
			tab.put(key, uint32(i), offalloc.Handle{})
			ref[key] = uint32(i)
		}
		if tab.count != len(ref) {
			t.Fatalf("count %d, ref %d", tab.count, len(ref))
		}
	}
	for k, v := range ref {
		if j := tab.find(k); j < 0 || tab.slots[j].n != v {
			t.Fatalf("final find(%d) = %d", k, j)
		}
	}
}

// TestBusySlabSpreads holds a slab's lock the way a concurrent Alloc would
// and checks that a request goes to another slab instead of waiting.
func TestBusySlabSpreads(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	const slab = 64 << 10
	p := newPool(t, Options{Size: 8 * slab, SlabSize: slab, NoPrefault: true})
	slabOf := func(b []byte) int64 {
		off, _ := p.Offset(b)
		return off / slab
	}
	first, err := p.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if s := slabOf(first); s != 7 {
		t.Fatalf("first allocation in slab %d, want the top slab 7", s)
	}
	p.slabs[7].mu.Lock()
	second, err := p.Alloc(100)
	p.slabs[7].mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if s := slabOf(second); s != 6 {
		t.Fatalf("allocation while slab 7 is busy went to slab %d, want 6", s)
	}
	// Two slabs open now (the limit for 8 slabs): with 7 busy the request
	// uses 6, with both busy it waits for one.
	p.slabs[7].mu.Lock()
	third, err := p.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if s := slabOf(third); s != 6 {
		t.Fatalf("allocation went to slab %d, want 6", s)
	}
	p.slabs[6].mu.Lock()
	done := make(chan []byte)
	go func() {
		b, _ := p.Alloc(100)
		done <- b
	}()
	select {
	case <-done:
		t.Fatal("allocation did not wait while both open slabs were busy")
	default:
	}
	// The waiter blocks on whichever open slab its hint names: free both.
	p.slabs[7].mu.Unlock()
	p.slabs[6].mu.Unlock()
	fourth := <-done
	if s := slabOf(fourth); s != 7 && s != 6 {
		t.Fatalf("allocation went to slab %d, want an open slab", s)
	}
	if st := p.Stats(); st.PartialSlabs != 2 {
		t.Fatalf("%d partial slabs, want 2", st.PartialSlabs)
	}
	for _, b := range [][]byte{first, second, third, fourth} {
		if err := p.Free(b); err != nil {
			t.Fatal(err)
		}
	}
}
