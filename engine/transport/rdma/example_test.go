package rdma_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/transport/rdma"
	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
)

// Two engines whose rdma transport runs on software NICs: one writes into
// the other's registered memory with an RDMA WRITE.
func Example() {
	fabric := soft.NewFabric()
	newEngine := func() (*engine.Engine, []byte, func()) {
		nic := fabric.NewDevice("mlx5_0", soft.Options{})
		e, err := engine.New(engine.Config{
			LocalServerName: "127.0.0.1",
			Protocols:       []string{"rdma", "tcp"},
			RDMA:            rdma.Config{Devices: []rdmadev.Device{nic}},
			Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			panic(err)
		}
		pool, _ := mempool.New(mempool.Options{Size: 1 << 20})
		buf, _ := pool.Alloc(1 << 20)
		if err := e.RegisterMemory(buf, "cpu:0"); err != nil {
			panic(err)
		}
		return e, buf, func() { e.Close(); nic.Close(); pool.Close() }
	}
	a, abuf, closeA := newEngine()
	defer closeA()
	b, bbuf, closeB := newEngine()
	defer closeB()

	ctx := context.Background()
	seg, _ := a.OpenSegment(ctx, b.Name())
	desc, _ := a.SegmentDesc(seg)
	copy(abuf, "hello, rdma")
	batch, _ := a.AllocateBatch(1)
	a.Submit(batch, []engine.Request{{Op: engine.Write, Local: abuf[:11], Target: seg, TargetAddr: desc.Buffers[0].Addr}})
	st, _ := a.Wait(ctx, batch)
	fmt.Println(a.Transports()[0], st.Status, string(bbuf[:11]))
	// Output: rdma COMPLETED hello, rdma
}
