package store

import (
	"fmt"
	"testing"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store/master"
)

// Benchmarks: two in-process clients and a real master on loopback. The
// writer/reader is a pure client, so every replica is on the other
// client's segment and every byte crosses the transport (tcp or shm).
// Put/Get use heap memory (staged); PutFrom/GetInto registered buffers
// (zero copy). BenchmarkMemcpy is the same machine's copy baseline.

var benchSizes = []int{4 << 10, 64 << 10, 1 << 20}

const benchSegment = 512 << 20

func benchPair(b testing.TB, proto string) (a *Client, s *Client, tm *testMaster) {
	tm = startMaster(b, master.Config{})
	s = newTestClient(b, tm, benchSegment, protocols(proto))
	a = newTestClient(b, tm, 0, protocols(proto), func(c *Config) { c.LocalBufferSize = 64 << 20 })
	return a, s, tm
}

func benchBuffer(b testing.TB, c *Client, n int) []byte {
	p, err := mempool.New(mempool.Options{Size: int64(n), SlabSize: mempool.MinSlabSize})
	if err != nil {
		b.Fatal(err)
	}
	buf := p.Bytes()[:n:n]
	if err := c.RegisterBuffer(buf); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		c.UnregisterBuffer(buf)
		p.Close()
	})
	return buf
}

func BenchmarkPut(b *testing.B) {
	for _, proto := range []string{"tcp", "shm"} {
		for _, size := range benchSizes {
			for _, reg := range []bool{false, true} {
				name := "Put"
				if reg {
					name = "PutFrom"
				}
				b.Run(fmt.Sprintf("%s/%s/%dKiB", proto, name, size>>10), func(b *testing.B) {
					a, s, _ := benchPair(b, proto)
					ctx := tctx(b)
					val := testutil.Bytes(size, 1)
					if reg {
						val = benchBuffer(b, a, size)
						copy(val, testutil.Bytes(size, 1))
					}
					perRound := benchSegment / 2 / size
					rc := ReplicateConfig{Preferred: []string{s.SegmentName()}}
					b.SetBytes(int64(size))
					b.ReportAllocs()
					b.ResetTimer()
					for i := 0; b.Loop(); i++ {
						if i > 0 && i%perRound == 0 {
							b.StopTimer()
							if _, err := a.RemoveAll(ctx, true); err != nil {
								b.Fatal(err)
							}
							b.StartTimer()
						}
						if err := a.Put(ctx, fmt.Sprintf("k%d", i), val, rc); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

func BenchmarkGet(b *testing.B) {
	for _, proto := range []string{"tcp", "shm"} {
		for _, size := range benchSizes {
			for _, reg := range []bool{false, true} {
				name := "Get"
				if reg {
					name = "GetInto"
				}
				b.Run(fmt.Sprintf("%s/%s/%dKiB", proto, name, size>>10), func(b *testing.B) {
					a, s, _ := benchPair(b, proto)
					ctx := tctx(b)
					keys := min(256, benchSegment/2/size)
					val := testutil.Bytes(size, 2)
					for i := range keys {
						if err := a.Put(ctx, fmt.Sprintf("k%d", i), val, ReplicateConfig{Preferred: []string{s.SegmentName()}}); err != nil {
							b.Fatal(err)
						}
					}
					dst := make([]byte, size)
					if reg {
						dst = benchBuffer(b, a, size)
					}
					b.SetBytes(int64(size))
					b.ReportAllocs()
					b.ResetTimer()
					for i := 0; b.Loop(); i++ {
						key := fmt.Sprintf("k%d", i%keys)
						if reg {
							if _, err := a.GetInto(ctx, key, dst); err != nil {
								b.Fatal(err)
							}
						} else if _, err := a.Get(ctx, key); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkMemcpy is the physical baseline for the same sizes.
func BenchmarkMemcpy(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			src, dst := testutil.Bytes(size, 3), make([]byte, size)
			b.SetBytes(int64(size))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}

// BenchmarkBatchPut is BatchPut of 16 4 KiB values from registered memory
// over shm (one op is one batch): the per-key cost of the batch path.
func BenchmarkBatchPut(b *testing.B) {
	const batch, size = 16, 4 << 10
	a, s, _ := benchPair(b, "shm")
	ctx := tctx(b)
	buf := benchBuffer(b, a, batch*size)
	vals := make([][]byte, batch)
	for i := range vals {
		vals[i] = buf[i*size : (i+1)*size]
	}
	keys := make([]string, batch)
	perRound := benchSegment / 2 / size / batch
	rc := ReplicateConfig{Preferred: []string{s.SegmentName()}}
	b.SetBytes(batch * size)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i > 0 && i%perRound == 0 {
			b.StopTimer()
			if _, err := a.RemoveAll(ctx, true); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		for j := range keys {
			keys[j] = fmt.Sprintf("k%d/%d", i, j)
		}
		for _, err := range a.BatchPut(ctx, keys, vals, rc) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkBatchGet is BatchGet of 16 4 KiB values over shm.
func BenchmarkBatchGet(b *testing.B) {
	const batch, size = 16, 4 << 10
	a, s, _ := benchPair(b, "shm")
	ctx := tctx(b)
	buf := benchBuffer(b, a, batch*size)
	vals := make([][]byte, batch)
	keys := make([]string, batch)
	for i := range vals {
		vals[i] = buf[i*size : (i+1)*size]
		keys[i] = fmt.Sprint("k", i)
	}
	for _, err := range a.BatchPut(ctx, keys, vals, ReplicateConfig{Preferred: []string{s.SegmentName()}}) {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(batch * size)
	b.ReportAllocs()
	for b.Loop() {
		_, errs := a.BatchGet(ctx, keys)
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}
