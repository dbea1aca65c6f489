package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/bench"
	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/internal/auth"
)

// rateUnits are the reference bench's --report_unit values.
var rateUnits = map[string]float64{
	"GB": 1e9, "GiB": 1 << 30, "Gb": 1e9 / 8,
	"MB": 1e6, "MiB": 1 << 20, "Mb": 1e6 / 8,
	"KB": 1e3, "KiB": 1 << 10, "Kb": 1e3 / 8,
}

func transferMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("transfer", flag.ContinueOnError)
	var c bench.TransferConfig
	fs.StringVar(&c.Mode, "mode", "loopback", "loopback (target and initiator in this process), initiator or target")
	fs.StringVar(&c.Operation, "operation", "write", "read or write")
	fs.StringVar(&c.Protocol, "protocol", "tcp", "transport: shm, tcp, cxl, rdma or efa")
	fs.StringVar(&c.FabricProvider, "fi_provider", "", "efa: libfabric provider (efa, tcp;ofi_rxm, sockets; default $FI_PROVIDER, else efa)")
	fs.StringVar(&c.CXLDevice, "cxl_device", "", "cxl: the DAX device or file both sides map (loopback default: a file in /dev/shm)")
	fs.StringVar(&c.RDMADevice, "rdma_device", "", `rdma: "soft" = software NICs in this process (loopback only), else comma-separated NIC names (default: every NIC libibverbs lists)`)
	fs.IntVar(&c.RDMANICs, "rdma_nics", 2, "rdma soft: software NICs per side")
	tableProtos := fs.String("table_protocols", "shm,cxl,tcp", "protocols of --table")
	fs.StringVar(&c.SegmentID, "segment_id", "", "target segment name (initiator mode), as printed by the target")
	fs.StringVar(&c.LocalServerName, "local_server_name", "127.0.0.1", "local host[:port] for the segment name")
	fs.StringVar(&c.MetadataServer, "metadata_server", engine.P2PHandshake, "metadata connection string")
	bufSize := fs.String("buffer_size", "1GiB", "registered buffer per side (raised to block_size*batch_size*threads)")
	fs.IntVar(&c.BatchSize, "batch_size", 128, "requests per batch")
	blockSize := fs.String("block_size", "65536", "bytes per request")
	duration := fs.Float64("duration", 10, "measured seconds")
	fs.IntVar(&c.Threads, "threads", 2, "submitting threads")
	fs.IntVar(&c.Lanes, "lanes", 0, "tcp: connections per peer (0 = transport default 4)")
	warmup := fs.Float64("warmup", 1, "seconds of warm-up before measuring")
	fs.StringVar(&c.BaselineServer, "baseline_server", "", "initiator: the target's baseline stream address (printed by the target)")
	unit := fs.String("report_unit", "GB", "GB|GiB|Gb|MB|MiB|Mb|KB|KiB|Kb")
	precision := fs.Int("report_precision", 2, "decimals in the throughput")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	table := fs.Bool("table", false, "run each of --table_protocols, write and read, 64 KiB and 1 MiB blocks; print a table")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	sec := auth.Flags(fs, auth.RoleClient, auth.FlagTokenFile.For("the engines authenticate every connection with it"),
		auth.FlagInsecure.For("open the engines' ports to any address, unauthenticated"))
	fs.BoolVar(&c.MooncakeCompat, "mooncake_compat", false, "serve Mooncake peers (unauthenticated, any address); refused with --token_file")
	authMode := fs.String("auth", "", `loopback: "both" runs authentication off and on in alternating rounds and prints both and the ratio (default: on with --token_file, else off)`)
	authRounds := fs.Int("auth_rounds", 3, "--auth both: rounds of each, --duration each")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := firstErr(positive("batch_size", c.BatchSize), positive("threads", c.Threads), positive("rdma_nics", c.RDMANICs),
		checkSeconds("duration", *duration, false), checkSeconds("warmup", *warmup, true)); err != nil {
		return err
	}
	switch {
	case c.Mode != "loopback" && c.Mode != "initiator" && c.Mode != "target":
		return usagef("--mode %q: want loopback, initiator or target", c.Mode)
	case c.Operation != "read" && c.Operation != "write":
		return usagef("--operation %q: want read or write", c.Operation)
	case c.Mode == "initiator" && c.SegmentID == "":
		return usagef("--mode initiator needs --segment_id (the target prints it)")
	}
	if c.Lanes < 0 {
		return usagef("--lanes %d: must not be negative (0 = the transport's default)", c.Lanes)
	}
	if *precision < 0 || *precision > 12 {
		return usagef("--report_precision %d: want 0 to 12", *precision)
	}
	mult, ok := rateUnits[*unit]
	if !ok {
		return usagef("--report_unit %q: want one of GB, GiB, Gb, MB, MiB, Mb, KB, KiB, Kb", *unit)
	}
	if err := checkLocalHost("local_server_name", c.LocalServerName); err != nil {
		return err
	}
	var err error
	c.Insecure = sec.Insecure
	if c.Token, err = auth.LoadToken(sec.TokenFile); err != nil {
		return usagef("--token_file: %w", err)
	}
	switch {
	case c.Token != nil && c.MooncakeCompat:
		return usagef("--mooncake_compat together with --token_file: Mooncake peers cannot authenticate; drop one")
	case c.Token != nil && c.Insecure:
		return usagef("%v", auth.ErrInsecureWithCredential)
	}
	switch *authMode {
	case "", "on", "off":
		if *authMode == "on" && c.Token == nil {
			return usagef("--auth on needs --token_file")
		}
		if *authMode == "off" {
			c.Token = nil
		}
	case "both":
		if c.Mode != "loopback" || *table {
			return usagef("--auth both runs in --mode loopback, without --table")
		}
		if *authRounds <= 0 {
			return usagef("--auth_rounds %d: must be positive", *authRounds)
		}
	default:
		return usagef("--auth %q: want on, off or both", *authMode)
	}
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	if c.BufferSize, err = parseSize(*bufSize); err != nil {
		return usagef("--buffer_size: %w", err)
	}
	bs, err := parseSize(*blockSize)
	if err != nil {
		return usagef("--block_size: %w", err)
	}
	if bs > 1<<30 {
		return usagef("--block_size %d: above 1 GiB", bs)
	}
	c.BlockSize = int(bs)
	c.Duration = time.Duration(*duration * float64(time.Second))
	c.Warmup = time.Duration(*warmup * float64(time.Second))
	if c.Warmup == 0 {
		c.Warmup = -1
	}
	if isTerminal(os.Stderr) && !*asJSON {
		c.Progress = os.Stderr
	}

	if c.Mode == "initiator" && c.BaselineServer == "" {
		fmt.Fprintln(os.Stderr, baselineNote)
	}
	if *table {
		return runTable(ctx, c, strings.Split(*tableProtos, ","), os.Stdout, os.Stderr)
	}
	if c.Mode == "target" {
		t, err := bench.ServeTarget(c)
		if err != nil {
			return err
		}
		defer t.Close()
		fmt.Printf("crescent-bench target: segment %s, baseline server %s\n", t.Segment, t.Baseline)
		fmt.Printf("run: crescent-bench transfer --mode initiator --protocol %s --segment_id %s --baseline_server %s\n", c.Protocol, t.Segment, t.Baseline)
		<-ctx.Done()
		return nil
	}
	if *authMode == "both" {
		return runAuthBoth(ctx, c, *authRounds, *asJSON, mult, *unit, *precision)
	}
	res, err := bench.RunTransfer(ctx, c)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	rate := float64(res.Bytes) / res.DurationS / mult
	fmt.Printf("%s %s, block %d, batch %d, threads %d\n", res.Protocol, res.Operation, res.BlockSize, res.BatchSize, res.Threads)
	fmt.Printf("latency per request: p50 %.0f us, p99 %.0f us, p999 %.0f us\n", res.P50us, res.P99us, res.P999us)
	fmt.Printf("baseline (%s, same run): %.2f GB/s; ratio %.2f\n", res.Baseline, res.BaselineGBps, res.Ratio)
	if d := res.DeviceCalls; d != nil {
		fmt.Printf("rdma device calls per batch of %d (%s device; one cgo crossing each on real NICs): %.1f = post %.1f + poll %.1f + arm %.1f + wait %.1f\n",
			res.BatchSize, d.Device, d.PerBatch, d.Post, d.Poll, d.Arm, d.Wait)
	}
	if f := res.FabricCalls; f != nil {
		fmt.Printf("libfabric cgo crossings per batch of %d (both engines): %.1f, of which progress calls %.1f, posting %.2f\n", res.BatchSize, f.PerBatch, f.Progress, f.Post)
	}
	fmt.Printf("Test completed: duration %.2f, batch count %d, throughput %.*f %s/s\n", res.DurationS, res.Batches, *precision, rate, *unit)
	return nil
}

// runAuthBoth prints the transfer with authentication off and on, from
// alternating rounds of one run, and their ratio.
func runAuthBoth(ctx context.Context, c bench.TransferConfig, rounds int, asJSON bool, mult float64, unit string, precision int) error {
	res, err := bench.RunTransferAuth(ctx, c, rounds)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("%s %s, block %d, batch %d, threads %d, %d alternating rounds of each\n", res.On.Protocol, res.On.Operation, res.On.BlockSize, res.On.BatchSize, res.On.Threads, res.Rounds)
	for _, r := range []struct {
		name string
		res  *bench.TransferResult
	}{{"auth off", &res.Off}, {"auth on ", &res.On}} {
		fmt.Printf("%s: %.*f %s/s (%.2f s, %d batches; baseline %s %.2f GB/s, mean of its rounds; ratio to it %.2f)\n", r.name, precision,
			float64(r.res.Bytes)/r.res.DurationS/mult, unit, r.res.DurationS, r.res.Batches, r.res.Baseline, r.res.BaselineGBps, r.res.Ratio)
	}
	fmt.Printf("ratio auth on / off: %.3f\n", res.Ratio)
	return nil
}

// baselineNote is said once in initiator mode without --baseline_server.
const baselineNote = "crescent-bench: no --baseline_server: the baseline is measured on this host (local loopback or memcpy), not over the network to the target"

// runTable runs every protocol x operation x block size and prints the
// table to out at the end; progress gets one line per run as it ends
// (always, terminal or not: a CI log shows where the time goes).
func runTable(ctx context.Context, base bench.TransferConfig, protos []string, out, progress io.Writer) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "protocol\top\tblock\tthreads\tGB/s\tbaseline\tbaseline GB/s\tratio\tp50 us\tp99 us\tp999 us\t")
	ops, blocks := []string{"write", "read"}, []int{64 << 10, 1 << 20}
	total := len(protos) * len(ops) * len(blocks)
	// Each run: a warm-up, then its duration of transfer and as much
	// of baseline, in alternating rounds.
	per := max(base.Warmup, 0) + 2*base.Duration
	fmt.Fprintf(progress, "crescent-bench: %d runs (%s; write, read; 64 KiB, 1 MiB) of at least %s each (warm-up, baseline, transfer; plus set-up): at least %s; the table follows on stdout\n",
		total, strings.Join(protos, ", "), per.Round(time.Second), (time.Duration(total) * per).Round(time.Second))
	start := time.Now()
	i := 0
	for _, proto := range protos {
		for _, op := range ops {
			for _, block := range blocks {
				i++
				c := base
				c.Protocol, c.Operation, c.BlockSize = proto, op, block
				res, err := bench.RunTransfer(ctx, c)
				if err != nil {
					return fmt.Errorf("%s %s %d: %w", proto, op, block, err)
				}
				el := time.Since(start)
				fmt.Fprintf(progress, "[%d/%d %s, about %s left] %s %s %s: %.2f GB/s, %s %.2f GB/s, ratio %.2f\n", i, total, fmtElapsed(el),
					fmtElapsed(el/time.Duration(i)*time.Duration(total-i)), res.Protocol, res.Operation, sizeName(res.BlockSize), res.ThroughputGBps, res.Baseline, res.BaselineGBps, res.Ratio)
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.2f\t%s\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t\n", res.Protocol, res.Operation, sizeName(res.BlockSize), res.Threads,
					res.ThroughputGBps, res.Baseline, res.BaselineGBps, res.Ratio, res.P50us, res.P99us, res.P999us)
				if ctx.Err() != nil {
					return tw.Flush()
				}
			}
		}
	}
	return tw.Flush()
}

// fmtElapsed is m:ss.
func fmtElapsed(d time.Duration) string {
	s := int(d.Round(time.Second) / time.Second)
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

func sizeName(n int) string {
	switch {
	case n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + " MiB"
	case n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + " KiB"
	}
	return strconv.Itoa(n)
}

// parseSize reads "65536", "64KiB", "1MiB", "1GiB", "1G", "512M".
func parseSize(s string) (int64, error) {
	orig := s
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	switch {
	case err == nil && n > 0 && n <= (1<<62)/mult:
		return n * mult, nil
	case err == nil && n <= 0:
		return 0, fmt.Errorf("size %q: must be positive", orig)
	case err == nil:
		return 0, fmt.Errorf("size %q: too large", orig)
	}
	return 0, fmt.Errorf("size %q: not a number with an optional unit (65536, 64KiB, 1MiB, 1GiB, 1MB)", orig)
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
