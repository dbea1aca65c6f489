package rdma_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
)

// BenchmarkBatch moves batches of 64 KiB writes between two transports on
// software NICs (2 per side) and reports the device-interface calls per
// batch — with libibverbs, one cgo crossing each — next to the bytes.
func BenchmarkBatch(b *testing.B) {
	for _, batch := range []int{32, 128, 512} {
		b.Run(fmt.Sprint(batch), func(b *testing.B) {
			const block = 64 << 10
			f := soft.NewFabric()
			x := newNode(b, f, nodeOpts{nics: 2, size: batch * block})
			y := newNode(b, f, nodeOpts{nics: 2, size: batch * block})
			p := y.peer()
			ch := make(chan result, batch)
			tasks := make([]*transport.Task, batch)
			for i := range tasks {
				tasks[i] = transport.NewTask(transport.Write, x.buf[i*block:(i+1)*block], y.addr(i*block), time.Time{}, func(_ *transport.Task, n int, err error) {
					ch <- result{n: n, err: err}
				})
			}
			run := func() {
				for _, tk := range tasks {
					tk.Reset()
					tk.Deadline = time.Now().Add(time.Minute)
				}
				x.tr.Submit(p, tasks)
				for range tasks {
					if r := <-ch; r.err != nil {
						b.Fatal(r.err)
					}
				}
			}
			run() // connect
			before := x.devStats().Add(y.devStats())
			b.SetBytes(int64(batch * block))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				run()
			}
			b.StopTimer()
			d := x.devStats().Add(y.devStats()).Sub(before)
			n := float64(b.N)
			b.ReportMetric(float64(d.HotCalls())/n, "calls/batch")
			b.ReportMetric(float64(d.PostCalls)/n, "posts/batch")
			b.ReportMetric(float64(d.PollCalls)/n, "polls/batch")
		})
	}
}
