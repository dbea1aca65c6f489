package bench

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {0.999, 999 * time.Microsecond}, {1, 1000 * time.Microsecond}} {
		got := h.Quantile(c.q)
		// Buckets have 1/64 relative width and report their lower bound.
		if got > c.want || float64(got) < float64(c.want)*(1-1.0/32) {
			t.Errorf("q%.3f = %v, want about %v", c.q, got, c.want)
		}
	}
	var o Histogram
	o.Record(5 * time.Second)
	h.Merge(&o)
	if h.Count() != 1001 || h.Quantile(1) != 5*time.Second {
		t.Fatalf("merge: count %d max %v", h.Count(), h.Quantile(1))
	}
	var empty Histogram
	if empty.Quantile(0.5) != 0 {
		t.Fatal("empty histogram")
	}
	// Bucket bounds are monotonic and each value lands in a bucket whose
	// lower bound is at most the value.
	for _, ns := range []uint64{0, 1, 63, 64, 65, 127, 128, 1000, 1 << 20, 1<<40 + 12345} {
		b := bucketOf(ns)
		if lowerBound(b) > ns || (b+1 < len(h.counts) && lowerBound(b+1) <= ns) {
			t.Errorf("value %d in bucket %d [%d, %d)", ns, b, lowerBound(b), lowerBound(b+1))
		}
	}
}

// TestRunTransferLoopback runs every protocol and direction briefly and
// checks the result is complete and self-consistent.
func TestRunTransferLoopback(t *testing.T) {
	for _, proto := range []string{"tcp", "shm", "cxl"} {
		for _, op := range []string{"write", "read"} {
			t.Run(proto+"-"+op, func(t *testing.T) {
				res, err := RunTransfer(context.Background(), TransferConfig{
					Protocol: proto, Operation: op, BlockSize: 64 << 10, BatchSize: 8, Threads: 2,
					Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond,
				})
				if err != nil {
					t.Fatal(err)
				}
				if res.Batches == 0 || res.ThroughputGBps <= 0 || res.BaselineGBps <= 0 || res.Ratio <= 0 {
					t.Fatalf("empty result %+v", res)
				}
				if res.Bytes != res.Batches*8*64<<10 {
					t.Fatalf("bytes %d for %d batches", res.Bytes, res.Batches)
				}
				if !(res.P50us > 0 && res.P50us <= res.P99us && res.P99us <= res.P999us) {
					t.Fatalf("latency percentiles %v %v %v", res.P50us, res.P99us, res.P999us)
				}
				want := map[string]string{"tcp": "tcp-stream", "shm": "memcpy", "cxl": "memcpy"}[proto]
				if res.Baseline != want {
					t.Fatalf("baseline %q", res.Baseline)
				}
				b, _ := json.Marshal(res)
				var m map[string]any
				json.Unmarshal(b, &m)
				for _, k := range []string{"protocol", "operation", "block_size", "batch_size", "threads", "throughput_gbps", "baseline_gbps", "ratio", "p50_us", "p99_us", "p999_us"} {
					if _, ok := m[k]; !ok {
						t.Errorf("JSON lacks %q", k)
					}
				}
			})
		}
	}
}

func TestTargetAndInitiator(t *testing.T) {
	cfg := TransferConfig{Protocol: "tcp", Operation: "write", BlockSize: 64 << 10, BatchSize: 4, Threads: 1, Duration: 200 * time.Millisecond, Warmup: -1}
	tg, err := ServeTarget(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	cfg.Mode, cfg.SegmentID, cfg.BaselineServer = "initiator", tg.Segment, tg.Baseline
	for _, op := range []string{"write", "read"} {
		cfg.Operation = op
		res, err := RunTransfer(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.Batches == 0 || res.BaselineGBps <= 0 {
			t.Fatalf("%s: %+v", op, res)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []TransferConfig{{Operation: "erase"}, {Mode: "sideways"}, {Mode: "initiator"}} {
		if _, err := RunTransfer(context.Background(), c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
