package master

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/internal/clock"
	"github.com/crescent-kv/crescent/store/alloc"
)

// benchMaster is a master with default config (1024 shards) and n
// segments of 1 TiB each: the master never touches memory, so capacity
// costs nothing.
func benchMaster(b testing.TB, n int) *Master {
	b.Helper()
	m, err := New(Config{Clock: clock.Real{}})
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		s := alloc.Segment{ID: UUID{Hi: 5, Lo: uint64(i + 1)}, Name: fmt.Sprint("host:", i), Base: uint64(i+1) << 44, Size: 1 << 40}
		if err := m.MountSegment(cl(uint64(i+1)), s); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// blockKey is "model/layer/block-%08d" without fmt's allocations.
func blockKey(_ []byte, i int) string {
	var b [32]byte
	out := append(b[:0], "model/layer/block-"...)
	var d [20]byte
	num := strconv.AppendInt(d[:0], int64(i), 10)
	for range 8 - len(num) {
		out = append(out, '0')
	}
	return string(append(out, num...))
}

func heapInuse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBytesPerKey measures the master's memory per object: the
// HeapInuse growth (after GC) from storing N one-replica objects with
// keys like "model/layer/block-00000042" (26 bytes), divided by N. The
// key strings are counted: the master keeps them. N is 1,000,000, or
// CRESCENT_BENCH_KEYS. CRESCENT_BENCH_HEAPPROFILE=file writes a heap
// profile of the full master (go tool pprof -sample_index=inuse_space).
func BenchmarkBytesPerKey(b *testing.B) {
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("CRESCENT_BENCH_KEYS")); err == nil && v > 0 {
		n = v
	}
	for b.Loop() {
		b.StopTimer()
		before := heapInuse()
		m := benchMaster(b, 1)
		b.StartTimer()
		c := cl(1)
		var buf []byte
		for i := range n {
			k := blockKey(buf, i)
			if _, err := m.PutStart(c, k, 4096, ReplicateConfig{}); err != nil {
				b.Fatal(err)
			}
			if err := m.PutEnd(c, k, Memory, nil); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		after := heapInuse()
		if m.Stats().Keys != int64(n) {
			b.Fatal("keys missing")
		}
		b.ReportMetric(float64(after-before)/float64(n), "bytes/key")
		if path := os.Getenv("CRESCENT_BENCH_HEAPPROFILE"); path != "" {
			// What each structure costs, with the master still alive
			// (-memprofile is written after it is gone).
			writeHeapProfile(b, path)
		}
		runtime.KeepAlive(m)
		m.Close()
		b.StartTimer()
	}
}

// processCPU is the process's user + system CPU time so far: per-object
// CPU holds still on a machine shared with other loads, where ns/op does
// not.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkBatchPut is the in-process metadata throughput: one op is one
// BatchPutStart + BatchPutEnd of 128 new 4 KiB objects on 4 segments.
// -benchtime=7813x stores 1,000,064 objects. cpu-ns/object is the
// process's CPU time (GC included) per object stored.
func BenchmarkBatchPut(b *testing.B) {
	const batch = 128
	for _, par := range []bool{false, true} {
		name := "serial"
		if par {
			name = "parallel"
		}
		b.Run(name, func(b *testing.B) {
			m := benchMaster(b, 4)
			var next atomic.Int64
			sizes := slices.Repeat([]uint64{4096}, batch)
			one := func(keys []string, buf []byte) {
				base := int(next.Add(batch)) - batch
				for i := range keys {
					keys[i] = blockKey(buf, base+i)
				}
				res, err := m.BatchPutStart(cl(1), keys, sizes, ReplicateConfig{})
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
				errs, err := m.BatchPutEnd(cl(1), keys, Memory, nil)
				if err != nil || errs[0] != nil {
					b.Fatal(err, errs[0])
				}
			}
			b.ReportAllocs()
			start, cpu0 := time.Now(), processCPU()
			if par {
				b.RunParallel(func(pb *testing.PB) {
					keys := make([]string, batch)
					var buf []byte
					for pb.Next() {
						one(keys, buf)
					}
				})
			} else {
				keys := make([]string, batch)
				var buf []byte
				for b.Loop() {
					one(keys, buf)
				}
			}
			b.ReportMetric(float64(next.Load())/time.Since(start).Seconds(), "objects/s")
			b.ReportMetric(float64(processCPU()-cpu0)/float64(next.Load()), "cpu-ns/object")
		})
	}
}

// BenchmarkGetReplicaList is one GetReplicaList (lease grant included) of
// a random key among 100,000 (or CRESCENT_BENCH_KEYS) with 2 replicas
// each: mostly the latency of the cache misses on the map, the record
// and the key.
func BenchmarkGetReplicaList(b *testing.B) {
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("CRESCENT_BENCH_KEYS")); err == nil && v > 0 {
		n = v
	}
	m := benchMaster(b, 4)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = blockKey(nil, i)
		if _, err := m.PutStart(cl(1), keys[i], 4096, ReplicateConfig{Replicas: 2}); err != nil {
			b.Fatal(err)
		}
		if err := m.PutEnd(cl(1), keys[i], Memory, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("single", func(b *testing.B) {
		r := rand.New(rand.NewPCG(1, 2))
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := m.GetReplicaList(keys[r.IntN(n)]); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The same over 1,024 hot keys: the CPU cost without cache misses.
	b.Run("single-hot", func(b *testing.B) {
		r := rand.New(rand.NewPCG(1, 2))
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := m.GetReplicaList(keys[r.IntN(1024)]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var seed atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r := rand.New(rand.NewPCG(seed.Add(1), 2))
			for pb.Next() {
				if _, _, err := m.GetReplicaList(keys[r.IntN(n)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// BenchmarkReserveCommit16 is 16 clients each doing Reserve (one
// reservation) + Commit (to a new key) in a loop on 4 segments: the load
// on the reservation tables (one mutex until they were split by owner).
// "putstart" is the same load through PutStart + PutEnd, which takes no
// reservation table, for comparison. Run with -mutexprofile to see where
// the clients wait.
func BenchmarkReserveCommit16(b *testing.B) {
	const clients = 16
	for _, mode := range []string{"reserve", "putstart"} {
		b.Run(mode, func(b *testing.B) {
			m := benchMaster(b, 4)
			var next, id atomic.Int64
			b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ReportAllocs()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				c := cl(uint64(id.Add(1)))
				spec := ReserveSpec{Size: 4096, Count: 1}
				for pb.Next() {
					k := blockKey(nil, int(next.Add(1)))
					if mode == "putstart" {
						if _, err := m.PutStart(c, k, 4096, ReplicateConfig{}); err != nil {
							b.Fatal(err)
						}
						if err := m.PutEnd(c, k, Memory, nil); err != nil {
							b.Fatal(err)
						}
						continue
					}
					r := m.Reserve(c, spec)
					if r.Err != nil {
						b.Fatal(r.Err)
					}
					if err := m.Commit(c, []CommitItem{{Key: k, ID: r.Reservations[0].ID}})[0]; err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(next.Load())/time.Since(start).Seconds(), "objects/s")
		})
	}
}

// BenchmarkBatchRemove is BatchRemove of 128 keys among 100,000 (or
// CRESCENT_BENCH_KEYS) stored ones; the keys are put back with the timer
// stopped. ns/key is the master's work per removed key.
func BenchmarkBatchRemove(b *testing.B) {
	const batch = 128
	n := 100_000
	if v, err := strconv.Atoi(os.Getenv("CRESCENT_BENCH_KEYS")); err == nil && v >= batch {
		n = v
	}
	n -= n % batch
	m := benchMaster(b, 4)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = blockKey(nil, i)
	}
	sizes := slices.Repeat([]uint64{4096}, batch)
	put := func(ks []string) {
		if _, err := m.BatchPutStart(cl(1), ks, sizes, ReplicateConfig{}); err != nil {
			b.Fatal(err)
		}
		if errs, err := m.BatchPutEnd(cl(1), ks, Memory, nil); err != nil || errs[0] != nil {
			b.Fatal(err, errs[0])
		}
	}
	for i := 0; i < n; i += batch {
		put(keys[i : i+batch])
	}
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	removed := 0
	for b.Loop() {
		at := r.IntN(n/batch) * batch
		ks := keys[at : at+batch]
		for i, err := range m.BatchRemove(ks, false) {
			if err != nil {
				b.Fatal(ks[i], err)
			}
		}
		removed += batch
		b.StopTimer()
		put(ks)
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(removed), "ns/key")
}
