package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/transport/efa"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// rdma (on the software device) and efa (on libfabric's tcp provider)
// both list NICs in one descriptor; each must find its own, whichever is
// tried first.
func TestRDMAAndEFAShareADescriptor(t *testing.T) {
	for _, order := range [][]string{{"rdma", "efa", "tcp"}, {"efa", "rdma", "tcp"}} {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			f := soft.NewFabric()
			mk := func(name string) *node {
				cfg := engine.Config{Protocols: order, EFA: efa.Config{Provider: "tcp;ofi_rxm"}}
				for i := 0; i < 2; i++ {
					d := f.NewDevice(fmt.Sprintf("%s_mlx5_%d", name, i), soft.Options{})
					t.Cleanup(func() { d.Close() })
					cfg.RDMA.Devices = append(cfg.RDMA.Devices, d)
				}
				return newNode(t, 4<<20, cfg)
			}
			a, b := mk("a"), mk("b")
			got := a.e.Transports()
			if len(got) != 3 {
				t.Skipf("transports %v: efa needs the fabric build tag and libfabric (make deps)", got)
			}
			seg, err := a.e.OpenSegment(context.Background(), b.e.Name())
			if err != nil {
				t.Fatal(err)
			}
			d, _ := a.e.SegmentDesc(seg)
			if d.Crescent == nil || d.Crescent.RDMA == nil || d.Crescent.EFA == nil || len(d.Devices) != d.Crescent.RDMA.Devices+d.Crescent.EFA.Devices {
				t.Fatalf("descriptor devices %+v, crescent %+v", d.Devices, d.Crescent)
			}
			testutil.Fill(a.buf[:1<<20], 5)
			id, _ := a.e.AllocateBatch(1)
			if err := a.e.Submit(id, []engine.Request{{Op: engine.Write, Local: a.buf[:1<<20], Target: seg, TargetAddr: b.addr(4096)}}); err != nil {
				t.Fatal(err)
			}
			wait(t, a.e, id)
			a.e.FreeBatch(id)
			if !bytes.Equal(b.buf[4096:4096+1<<20], a.buf[:1<<20]) {
				t.Fatal("bytes did not land")
			}
		})
	}
}
