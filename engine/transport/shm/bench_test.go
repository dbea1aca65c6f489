package shm_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/transport"
)

// BenchmarkShmWrite/Read copy blocks between two transports' pool memory;
// BenchmarkMemcpy copies the same blocks between the same kind of buffers
// in the same goroutine: the limit the transport is measured against.

const benchBuf = 64 << 20

var benchBlocks = []int{64 << 10, 1 << 20}

func blockName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

func BenchmarkShmWrite(b *testing.B) { benchShm(b, transport.Write) }
func BenchmarkShmRead(b *testing.B)  { benchShm(b, transport.Read) }

func benchShm(b *testing.B, op transport.Op) {
	for _, block := range benchBlocks {
		b.Run(blockName(block), func(b *testing.B) {
			a := newNode(b, "a", benchBuf, nodeOpts{})
			t := newNode(b, "t", benchBuf, nodeOpts{})
			p := t.peer()
			if !a.tr.Accepts(p, t.addr(0), benchBuf) {
				b.Fatal("not accepted")
			}
			// One Submit carries a batch of tasks, reused from batch to batch.
			nblocks := benchBuf / block
			batch := min(nblocks, 16)
			var failed error
			done := func(_ *transport.Task, _ int, err error) {
				if err != nil {
					failed = err
				}
			}
			tasks := make([]*transport.Task, batch)
			for i := range tasks {
				tasks[i] = transport.NewTask(op, nil, 0, soonBench(), done)
			}
			b.SetBytes(int64(block))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				k := min(batch, b.N-i)
				for j, tk := range tasks[:k] {
					off := ((i + j) % nblocks) * block
					tk.Local, tk.RemoteAddr = a.buf[off:off+block], t.addr(off)
				}
				a.tr.Submit(p, tasks[:k])
				if failed != nil {
					b.Fatal(failed)
				}
			}
		})
	}
}

func BenchmarkMemcpy(b *testing.B) {
	for _, block := range benchBlocks {
		b.Run(blockName(block), func(b *testing.B) {
			a := newNode(b, "a", benchBuf, nodeOpts{})
			t := newNode(b, "t", benchBuf, nodeOpts{})
			nblocks := benchBuf / block
			b.SetBytes(int64(block))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				off := (i % nblocks) * block
				copy(t.buf[off:off+block], a.buf[off:off+block])
			}
		})
	}
}

func soonBench() time.Time { return time.Now().Add(time.Hour) }
