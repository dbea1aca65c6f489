package bench

import (
	"context"
	"testing"
	"time"
)

// TestRunTransferRDMASoft runs the transfer benchmark on the software
// RDMA device and checks the device-call counts: posts per batch do not
// grow with the number of requests.
func TestRunTransferRDMASoft(t *testing.T) {
	for _, op := range []string{"write", "read"} {
		for _, batch := range []int{8, 64} {
			res, err := RunTransfer(context.Background(), TransferConfig{
				Protocol: "rdma", RDMADevice: SoftRDMA, Operation: op, BlockSize: 64 << 10, BatchSize: batch, Threads: 1,
				Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Batches == 0 || res.Baseline != "memcpy" || res.BaselineGBps <= 0 {
				t.Fatalf("%s: %+v", op, res)
			}
			d := res.DeviceCalls
			if d == nil || d.Device != SoftRDMA || d.WorkRequests != float64(batch) {
				t.Fatalf("%s batch %d: device calls %+v", op, batch, d)
			}
			// 2 NICs per side, 2 QPs per endpoint: at most one post per QP.
			if d.Post > 4 {
				t.Fatalf("%s batch %d: %.1f posts per batch", op, batch, d.Post)
			}
		}
	}
}

func TestRDMASoftNeedsLoopback(t *testing.T) {
	c := TransferConfig{Protocol: "rdma", RDMADevice: SoftRDMA, Mode: "initiator", SegmentID: "127.0.0.1:1"}
	if _, err := RunTransfer(context.Background(), c); err == nil {
		t.Fatal("soft device accepted in initiator mode")
	}
	if _, err := ServeTarget(TransferConfig{Protocol: "rdma", RDMADevice: SoftRDMA}); err == nil {
		t.Fatal("soft device accepted in target mode")
	}
}
