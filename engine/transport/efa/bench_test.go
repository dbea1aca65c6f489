package efa_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/efa"
	"github.com/crescent-kv/crescent/internal/fabric"
)

// BenchmarkBatch128 moves batches of 128 requests over each provider on
// loopback, and reports the crossings into C per batch (both transports
// of the process: the target's progress calls are included).
func BenchmarkBatch128(b *testing.B) {
	needFabric(b)
	for _, prov := range providers() {
		for _, block := range []int{64 << 10, 1 << 20} {
			for _, op := range []transport.Op{transport.Write, transport.Read} {
				b.Run(prov+"/"+op.String()+"/"+strconv.Itoa(block>>10)+"KiB", func(b *testing.B) {
					needProvider(b, prov)
					size := 128 * block
					x := newNode(b, prov, size, efa.Config{})
					y := newNode(b, prov, size, efa.Config{})
					py := y.peer()
					results := make(chan result, 128)
					tasks := make([]*transport.Task, 128)
					batch := func() {
						dl := time.Now().Add(time.Minute)
						for i := range tasks {
							tasks[i] = task(results, op, x.buf[i*block:(i+1)*block], y.addr(i*block), dl)
						}
						for _, r := range submit(b, x, py, tasks, results, time.Minute) {
							if r.err != nil {
								b.Fatal(r.err)
							}
						}
					}
					batch() // connect
					b.SetBytes(int64(size))
					b.ReportAllocs()
					before := fabric.ReadStats()
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						batch()
					}
					b.StopTimer()
					d := fabric.ReadStats().Sub(before)
					b.ReportMetric(float64(d.Calls)/float64(b.N), "crossings/batch")
					b.ReportMetric(float64(d.PostCalls)/float64(b.N), "posts/batch")
				})
			}
		}
	}
}
