package offalloc

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkAllocFree measures one Alloc plus one Free of a fixed size in
// an allocator that already holds fragmented background allocations.
func BenchmarkAllocFree(b *testing.B) {
	for _, size := range []uint64{64, 4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			a := mustNew(b, 1<<34)
			r := rand.New(rand.NewPCG(1, 1))
			var bg []Allocation
			for range 10000 {
				al, err := a.Alloc(64 + r.Uint64N(1<<20))
				if err != nil {
					b.Fatal(err)
				}
				bg = append(bg, al)
			}
			for i := 0; i < len(bg); i += 2 {
				_ = a.Free(bg[i])
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				al, err := a.Alloc(size)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(al); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkChurn keeps a million live allocations of mixed sizes in a
// 1 TiB space and replaces a random one per iteration (one Free plus one
// Alloc), the store master's pattern.
func BenchmarkChurn(b *testing.B) {
	const live = 1 << 20
	a := mustNew(b, 1<<40, WithCapacity(2*live))
	r := rand.New(rand.NewPCG(2, 2))
	size := func() uint64 { return 4096 + r.Uint64N(1<<20) }
	all := make([]Allocation, live)
	for i := range all {
		al, err := a.Alloc(size())
		if err != nil {
			b.Fatal(err)
		}
		all[i] = al
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		i := r.IntN(live)
		if err := a.Free(all[i]); err != nil {
			b.Fatal(err)
		}
		al, err := a.Alloc(size())
		if err != nil {
			b.Fatal(err)
		}
		all[i] = al
	}
	b.StopTimer()
	s := a.Stats()
	b.ReportMetric(float64(s.FreeRanges), "free-ranges")
	b.ReportMetric(float64(s.Nodes)*40/live, "node-bytes/alloc")
}
