//go:build invariants

package mempool

import "testing"

func TestPoisonOnFree(t *testing.T) {
	const slab = 1 << 20
	p := newPool(t, Options{Size: 4 * slab, SlabSize: slab})
	for _, n := range []int{100, 5000, 64 << 10, 2*slab + 1} {
		b, err := p.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		off, _ := p.Offset(b)
		for i := range b {
			b[i] = 0
		}
		if err := p.Free(b); err != nil {
			t.Fatal(err)
		}
		for i, c := range p.Bytes()[off : off+int64(n)] {
			if c != poisonByte {
				t.Fatalf("Alloc(%d): byte %d after Free = %#x, want poison %#x", n, i, c, poisonByte)
			}
		}
	}
}
