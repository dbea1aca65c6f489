package alloc

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRestoreBehavesAlike: a segment rebuilt from its Layout (and a table
// from its Indices) then goes through the same allocations, frees,
// mounts and releases as the original with the same results.
func TestRestoreBehavesAlike(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 7))
		a := New(FreeRatioFirst)
		var ids []UUID
		mount := func(x *Allocator, n int) uint32 {
			s := Segment{ID: UUID{Hi: 9, Lo: uint64(n)}, Name: "h", Base: uint64(n+1) << 32, Size: 1 << 20}
			idx, err := x.Mount(s, nil)
			require.NoError(t, err)
			return idx
		}
		for i := range 6 {
			mount(a, i)
			ids = append(ids, UUID{Hi: 9, Lo: uint64(i)})
		}
		for _, i := range []int{1, 4} { // holes in the table
			idx, err := a.Unmount(ids[i], nil)
			require.NoError(t, err)
			require.NoError(t, a.Release(idx, nil))
		}
		type live struct {
			p    Placement
			size uint64
		}
		var held []live
		segs := []uint32{0, 2, 3, 5}
		step := func(x *Allocator, held *[]live, r *rand.Rand) uint64 {
			if len(*held) > 0 && r.IntN(3) == 0 {
				i := r.IntN(len(*held))
				h := (*held)[i]
				require.NoError(t, x.Free(h.p, h.size))
				*held = append((*held)[:i], (*held)[i+1:]...)
				return 0
			}
			size := uint64(1 + r.IntN(20000))
			p, err := x.AllocateOn(segs[r.IntN(len(segs))], size)
			if err != nil {
				return 1
			}
			*held = append(*held, live{p, size})
			return p.Addr
		}
		for range 2000 {
			step(a, &held, r)
		}
		// Rebuild a copy.
		b := New(FreeRatioFirst)
		n, free := a.Indices()
		var mounts []uint32
		for _, s := range a.Segments() {
			mounts = append(mounts, s.Index)
		}
		require.NoError(t, b.RestoreIndices(n, free, mounts))
		byAddr := map[uint64]Placement{}
		for _, s := range a.Segments() {
			idx, err := b.Mount(s.Segment, nil)
			require.NoError(t, err)
			require.Equal(t, s.Index, idx)
			rs, ok := a.Layout(s.Index)
			require.True(t, ok)
			ps, err := b.Restore(idx, rs)
			require.NoError(t, err)
			for _, p := range ps {
				byAddr[p.Addr] = p
			}
		}
		bheld := make([]live, len(held))
		for i, h := range held {
			p, ok := byAddr[h.p.Addr]
			require.True(t, ok)
			bheld[i] = live{p, h.size}
		}
		require.Equal(t, a.Segments(), b.Segments())
		ra, rb := rand.New(rand.NewPCG(seed, 8)), rand.New(rand.NewPCG(seed, 8))
		for i := range 2000 {
			require.Equal(t, step(a, &held, ra), step(b, &bheld, rb), "seed %d step %d", seed, i)
		}
		require.Equal(t, a.Segments(), b.Segments())
		next := func(x *Allocator) uint32 { return mount(x, 100) }
		require.Equal(t, next(a), next(b), "the next mount reuses the same index")
	}
}

func TestRestoreRefusesBadLayouts(t *testing.T) {
	a := New(Random)
	idx, err := a.Mount(Segment{ID: UUID{Lo: 1}, Name: "h", Base: 1 << 20, Size: 1 << 16}, nil)
	require.NoError(t, err)
	full := []Range{{Addr: 1 << 20, Size: 4096}, {Addr: 1<<20 + 4096, Size: 1<<16 - 4096, Free: true}}
	for name, rs := range map[string][]Range{
		"gap":         {{Addr: 1<<20 + 64, Size: 1<<16 - 64, Free: true}},
		"short":       {{Addr: 1 << 20, Size: 1 << 15, Free: true}},
		"long":        {{Addr: 1 << 20, Size: 1 << 17, Free: true}},
		"misaligned":  {{Addr: 1 << 20, Size: 100}, {Addr: 1<<20 + 100, Size: 1<<16 - 100, Free: true}},
		"not a class": {{Addr: 1 << 20, Size: 64 * 17}, {Addr: 1<<20 + 64*17, Size: 1<<16 - 64*17, Free: true}},
	} {
		_, err := a.Restore(idx, rs)
		require.Error(t, err, name)
		b := New(Random)
		i, err := b.Mount(Segment{ID: UUID{Lo: 1}, Name: "h", Base: 1 << 20, Size: 1 << 16}, nil)
		require.NoError(t, err)
		a, idx = b, i
	}
	_, err = a.Restore(idx, full)
	require.NoError(t, err)
	_, err = a.Restore(idx, full)
	require.Error(t, err, "a segment restored twice")
	require.Error(t, New(Random).RestoreIndices(2, []uint32{0}, []uint32{0}))
	require.Error(t, New(Random).RestoreIndices(2, []uint32{0}, []uint32{5}))
}
