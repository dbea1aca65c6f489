package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/crescent-kv/crescent/bench"
)

// storeLocal is "store --dummy N": reads and writes through dummy
// clients of a real client's local socket (bench.RunStoreLocal).
func storeLocal(ctx context.Context, dummies int, hot bool, valueSize int, d time.Duration, asJSON bool, out io.Writer) error {
	res, err := bench.RunStoreLocal(ctx, bench.LocalConfig{Dummies: dummies, ValueSize: valueSize, Duration: d, HotOnly: hot})
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(out).Encode(res)
	}
	fmt.Fprintf(out, "store through %d dummy clients, %s values\n", res.Dummies, sizeName(res.ValueSize))
	ph := func(name string, p *bench.LocalPhase) {
		if p != nil {
			fmt.Fprintf(out, "%s: %.0f ops/s, %.2f GB/s; p50 %.1f us, p99 %.1f us\n", name, float64(p.Ops)/d.Seconds(), p.GBps, p.P50us, p.P99us)
		}
	}
	ph("get, hot-cache hit (shared view)", &res.Hot)
	fmt.Fprintf(out, "memcpy (same run, %d threads): %.2f GB/s; ratio hot/memcpy: %.2f\n", res.Dummies, res.BaselineGBps, res.Ratio)
	ph("get, local replica (into a registered pool)", res.LocalReplica)
	ph("get, remote replica (into a registered pool)", res.Remote)
	ph("put from a registered pool (+ remove)", res.Put)
	if res.IPCp50us > 0 {
		fmt.Fprintf(out, "IPC round trip: p50 %.1f us, p99 %.1f us\n", res.IPCp50us, res.IPCp99us)
	}
	return nil
}
