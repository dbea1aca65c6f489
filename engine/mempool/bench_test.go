package mempool

import (
	"fmt"
	"testing"
)

var benchSizes = []int{4 << 10, 64 << 10, 1 << 20, 32 << 20}

func benchPool(b *testing.B) *Pool {
	b.Helper()
	// Prefaulted at creation, so no timed loop pays first-touch faults.
	return newPool(b, Options{Size: 256 << 20, SlabSize: 16 << 20})
}

// BenchmarkAllocFree is one Alloc plus one Free on one goroutine; sizes up
// to a slab are served in a slab, 32 MiB takes two whole slabs.
func BenchmarkAllocFree(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("size=%s", human(n)), func(b *testing.B) {
			p := benchPool(b)
			b.ReportAllocs()
			for b.Loop() {
				buf, err := p.Alloc(n)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Free(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAllocFreeParallel is the same from GOMAXPROCS goroutines at once.
func BenchmarkAllocFreeParallel(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("size=%s", human(n)), func(b *testing.B) {
			p := benchPool(b)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					buf, err := p.Alloc(n)
					if err != nil {
						b.Error(err)
						return
					}
					if err := p.Free(buf); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkChurn keeps 1000 live 4-64 KiB buffers and replaces one per
// iteration, so slabs are fragmented as in a long-running process.
func BenchmarkChurn(b *testing.B) {
	p := benchPool(b)
	live := make([][]byte, 1000)
	size := func(i int) int { return 4<<10 + (i*7919)%(60<<10) }
	for i := range live {
		buf, err := p.Alloc(size(i))
		if err != nil {
			b.Fatal(err)
		}
		live[i] = buf
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		j := (i * 104729) % len(live)
		if err := p.Free(live[j]); err != nil {
			b.Fatal(err)
		}
		buf, err := p.Alloc(size(i))
		if err != nil {
			b.Fatal(err)
		}
		live[j] = buf
		i++
	}
}

// BenchmarkNew measures creating (and prefaulting) and closing a 64 MiB
// pool: the one-off first-touch cost a pool pays so the data path does not.
func BenchmarkNew(b *testing.B) {
	for _, prefault := range []bool{true, false} {
		b.Run(fmt.Sprintf("prefault=%v", prefault), func(b *testing.B) {
			if prefault {
				b.SetBytes(64 << 20) // MB/s = prefault rate
			}
			b.ReportAllocs()
			for b.Loop() {
				p, err := New(Options{Size: 64 << 20, NoPrefault: !prefault})
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkLookup(b *testing.B) {
	p := benchPool(b)
	buf, _ := p.Alloc(1 << 20)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, _, ok := Lookup(buf); !ok {
			b.Fatal("not found")
		}
	}
}

func human(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprint(n)
}
