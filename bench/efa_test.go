package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/internal/fabric"
)

// TestRunTransferEFA runs protocol efa on libfabric's tcp provider: the
// baseline is the raw TCP stream and the crossings per batch are
// reported, posting at most once per batch.
func TestRunTransferEFA(t *testing.T) {
	if err := fabric.Load(""); err != nil {
		if os.Getenv("CRESCENT_REQUIRE_DEPS") == "1" {
			t.Fatal(err)
		}
		t.Skipf("%v (run make deps; build with -tags fabric)", err)
	}
	for _, op := range []string{"write", "read"} {
		t.Run(op, func(t *testing.T) {
			res, err := RunTransfer(context.Background(), TransferConfig{
				Protocol: "efa", FabricProvider: "tcp;ofi_rxm", Operation: op, BlockSize: 64 << 10, BatchSize: 16, Threads: 2,
				Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Batches == 0 || res.ThroughputGBps <= 0 || res.Baseline != "tcp-stream" || res.BaselineGBps <= 0 {
				t.Fatalf("result %+v", res)
			}
			f := res.FabricCalls
			if f == nil || f.Post <= 0 || f.Post > 1 || f.PerBatch < f.Progress {
				t.Fatalf("fabric calls %+v", f)
			}
		})
	}
}
