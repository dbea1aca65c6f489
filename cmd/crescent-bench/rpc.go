package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/crescent-kv/crescent/bench"
)

// rpcMain is crescent-bench rpc: unary latency of the master's RPC
// layers (bench.RunRPC).
func rpcMain(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("rpc", flag.ContinueOnError)
	layers := fs.String("layers", strings.Join(bench.RPCLayers, ","), "RPC layers to measure: grpc (the baseline), grpc_tuned, crpc, drpc")
	inflight := fs.String("inflight", "1,8", "calls kept in flight, one row each")
	duration := fs.Float64("duration", 3, "measured seconds per layer and in-flight count")
	rounds := fs.Int("rounds", 0, "slices each cell is measured in, the layers taking turns (default: one per 0.5 s, at least 2)")
	asJSON := fs.Bool("json", false, "print the rows as JSON")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (master and clients) to this file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkSeconds("duration", *duration, false); err != nil {
		return err
	}
	if *rounds < 0 {
		return usagef("--rounds %d: must not be negative (0 = the default)", *rounds)
	}
	c := bench.RPCConfig{Duration: time.Duration(*duration * float64(time.Second)), Rounds: *rounds}
	for _, l := range strings.Split(*layers, ",") {
		if l = strings.TrimSpace(l); l != "" {
			c.Layers = append(c.Layers, l)
		}
	}
	for _, s := range strings.Split(*inflight, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return usagef("--inflight %q: want positive counts separated by commas", *inflight)
		}
		c.Inflight = append(c.Inflight, n)
	}
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	rows, err := bench.RunRPC(ctx, c)
	stop()
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	fmt.Fprintf(out, "%-11s %9s %12s %9s %9s %9s %12s\n", "layer", "in flight", "calls/s", "p50 us", "p99 us", "vs grpc", "cpu us/call")
	for _, r := range rows {
		fmt.Fprintf(out, "%-11s %9d %12.0f %9.1f %9.1f %8.2fx %12.1f\n", r.Layer, r.Inflight, r.CallsPerSec, r.P50Us, r.P99Us, r.Ratio, r.CPUUsPerCall)
	}
	return nil
}
