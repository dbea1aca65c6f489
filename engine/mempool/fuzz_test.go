package mempool

import (
	"errors"
	"testing"
)

// FuzzFree hands Free arbitrary slices of the arena: only a slice equal to
// a live allocation may be accepted (and is then re-allocated); anything
// else must get ErrNotAllocated without disturbing the live allocations.
func FuzzFree(f *testing.F) {
	const slab = 64 << 10
	p := newPool(f, Options{Size: 4 * slab, SlabSize: slab, NoPrefault: true})
	var live [][]byte
	for _, n := range []int{1, 100, 4096, 5000, slab, slab + 1} {
		b, err := p.Alloc(n)
		if err != nil {
			f.Fatal(err)
		}
		live = append(live, b)
	}
	base := func(b []byte) uint32 { off, _ := p.Offset(b); return uint32(off) }
	for _, b := range live {
		f.Add(base(b), uint32(len(b)), uint32(cap(b)))
		f.Add(base(b), uint32(len(b)-1), uint32(cap(b)))
		f.Add(base(b)+64, uint32(len(b)), uint32(cap(b)))
	}
	f.Fuzz(func(t *testing.T, off, n, c uint32) {
		size := uint32(p.Size())
		if off > size || c > size-off || n > c {
			return
		}
		b := p.Bytes()[off : off+n : off+c]
		err := p.Free(b)
		for i, l := range live {
			if off == base(l) && int(n) == len(l) && int(c) == cap(l) {
				if err != nil {
					t.Fatalf("Free of live allocation %d: %v", i, err)
				}
				nb, err := p.Alloc(len(l))
				if err != nil {
					t.Fatal(err)
				}
				live[i] = nb
				return
			}
		}
		if !errors.Is(err, ErrNotAllocated) {
			t.Fatalf("Free(arena[%d:%d:%d]) = %v, want ErrNotAllocated", off, off+n, off+c, err)
		}
		if st := p.Stats(); st.Allocs != int64(len(live)) {
			t.Fatalf("%d allocations, want %d", st.Allocs, len(live))
		}
	})
}
