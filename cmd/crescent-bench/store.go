package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/crescent-kv/crescent/bench"
)

// storeClientCmd is the hidden subcommand a client process runs
// (--client_processes).
const storeClientCmd = "store-client"

func storeMain(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("store", flag.ContinueOnError)
	var c bench.StoreConfig
	fs.StringVar(&c.MasterAddr, "master", "", "existing master host:port (default: start one in this process)")
	fs.IntVar(&c.Clients, "clients", bench.DefaultStoreClients, "store clients, each contributing --segment_size")
	fs.BoolVar(&c.ClientProcesses, "client_processes", false, "run each client in its own process")
	segSize := fs.String("segment_size", "512MiB", "memory each client contributes")
	stage := fs.String("local_buffer_size", "64MiB", "each client's staging pool")
	valSize := fs.String("value_size", "1MiB", "bytes per value")
	fs.StringVar(&c.Operation, "operation", "get", "put, get, mixed, or meta (master metadata throughput: BatchPutStart+BatchPutEnd of --objects)")
	fs.Float64Var(&c.GetRatio, "get_ratio", 0.5, "mixed: share of gets")
	duration := fs.Float64("duration", 10, "measured seconds (rounds of about 1 s, alternating with the baseline)")
	warmup := fs.Float64("warmup", 1, "seconds of warm-up before measuring")
	fs.IntVar(&c.Threads, "threads", bench.DefaultStoreThreads, "concurrent workers per client")
	fs.StringVar(&c.Protocol, "protocol", "", "the one engine transport to use (default: the engine's order, shm first on one host)")
	fs.IntVar(&c.Replicas, "replicas", 1, "replicas per value")
	fs.IntVar(&c.Batch, "batch", 0, "keys per call: BatchPut/BatchGet when > 1 (default 1; meta 128)")
	zeroCopy := fs.Bool("zero_copy", true, "PutFrom/GetInto on registered buffers; false: Put/Get on Go heap memory")
	fs.StringVar(&c.Baseline, "baseline", "", "redis, engine (the same clients, buffers and concurrency moving the bytes with the transfer engine alone), oplog_off (the same workload on a second in-process master with the log off), tls_off (with --tls: the same workload without TLS) or none (default: tls_off with --tls, oplog_off with --oplog, else redis when redis-server is installed)")
	fs.StringVar(&c.Oplog, "oplog", "off", "the in-process master's operation log: off, local (files in --oplog_dir), etcd (a single-member etcd the bench starts, data on disk, fsync on) or etcd://host:port[,host:port]")
	fs.StringVar(&c.OplogDir, "oplog_dir", "", "--oplog local: the log's directory (default: a temporary directory in the working directory, removed after)")
	fs.StringVar(&c.RedisServer, "redis_server", "", "redis-server binary (default: $PATH)")
	fs.StringVar(&c.LocalHostname, "local_server_name", "127.0.0.1", "clients' engine host")
	aheadBytes := fs.String("put_ahead_bytes", "", "pool memory each client's put-ahead reservations may hold (default: the client's, 64MiB); put runs leave room for it")
	fs.IntVar(&c.LocationCache, "location_cache", 0, "objects whose location each client caches, so repeated gets skip the master (0: off)")
	fs.IntVar(&c.PutAhead, "put_ahead", 0, "reservations each client keeps per value size for one-round-trip puts (0: the client's default, -1: off)")
	fs.StringVar(&c.MasterProtocol, "master_protocol", "", "clients' protocol to the master: auto (crpc when the master answers it), crpc, grpc, grpc_tuned (the in-process master serves tuned gRPC options too) or drpc (in-process master only)")
	fs.IntVar(&c.Objects, "objects", bench.DefaultMetaObjects, "meta: objects to store")
	fs.BoolVar(&c.TLS, "tls", false, "serve the in-process master over TLS with client certificates (mTLS) and measure against the same run without TLS (--baseline tls_off, the default then)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	dummies := fs.Int("dummy", 0, "N > 0: measure gets and puts through N dummy clients of a real client's local socket (hot-cache hit vs memcpy, local and remote replica, IPC round trip, put)")
	hot := fs.Bool("hot", false, "with --dummy: only the hot-cache hit and its memcpy baseline")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process to this file (client processes: to FILE.PID each)")
	traceFile := fs.String("trace", "", "write an execution trace of this process to this file (client processes: to FILE.PID each), for go tool trace: -pprof=sched is where goroutines waited for a CPU, -pprof=syscall where they blocked in the kernel")
	memProfile := fs.String("memprofile", "", "write this process's allocation profile (every allocation since it started, sampled one per 4 KiB) to this file at the end (client processes: to FILE.PID each), for go tool pprof -sample_index=alloc_space or alloc_objects")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// 0 would quietly become the default in bench.StoreConfig.
	if err := firstErr(positive("clients", c.Clients), positive("threads", c.Threads), positive("replicas", c.Replicas),
		positive("objects", c.Objects), checkSeconds("duration", *duration, false), checkSeconds("warmup", *warmup, true)); err != nil {
		return err
	}
	switch {
	case c.Batch < 0:
		return usagef("--batch %d: must not be negative (0 = the default)", c.Batch)
	case c.LocationCache < 0:
		return usagef("--location_cache %d: want 0 (off) or a count", c.LocationCache)
	case c.PutAhead < -1:
		return usagef("--put_ahead %d: want -1 (off), 0 (the client's default) or a count", c.PutAhead)
	case !(c.GetRatio > 0 && c.GetRatio <= 1):
		return usagef("--get_ratio %v: want a share in (0, 1]", c.GetRatio)
	}
	if err := checkMaster(c.MasterAddr); err != nil {
		return err
	}
	if err := checkLocalHost("local_server_name", c.LocalHostname); err != nil {
		return err
	}
	var err error
	if c.SegmentSize, err = parseSize(*segSize); err != nil {
		return usagef("--segment_size: %w", err)
	}
	if *aheadBytes != "" {
		if c.PutAheadBytes, err = parseSize(*aheadBytes); err != nil {
			return usagef("--put_ahead_bytes: %w", err)
		}
	}
	if c.LocalBufferSize, err = parseSize(*stage); err != nil {
		return usagef("--local_buffer_size: %w", err)
	}
	vs, err := parseSize(*valSize)
	if err != nil {
		return usagef("--value_size: %w", err)
	}
	if vs > 1<<30 {
		return usagef("--value_size %d above 1 GiB", vs)
	}
	c.ValueSize = int(vs)
	c.Staged = !*zeroCopy
	c.Duration = time.Duration(*duration * float64(time.Second))
	c.Warmup = time.Duration(*warmup * float64(time.Second))
	if c.Warmup == 0 {
		c.Warmup = -1
	}
	if c.ClientProcesses {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("--client_processes: %w", err)
		}
		c.ClientCommand = []string{exe, storeClientCmd}
		if *cpuProfile != "" {
			c.ClientCommand = append(c.ClientCommand, "--cpuprofile", *cpuProfile)
		}
		if *memProfile != "" {
			c.ClientCommand = append(c.ClientCommand, "--memprofile", *memProfile)
		}
		if *traceFile != "" {
			c.ClientCommand = append(c.ClientCommand, "--trace", *traceFile)
		}
	}
	if !*asJSON {
		c.Progress = os.Stderr
	}
	stop, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	stopMem, err := startMemProfile(*memProfile)
	if err != nil {
		return err
	}
	defer stopMem()
	stopTrace, err := startTrace(*traceFile)
	if err != nil {
		return err
	}
	defer stopTrace()
	if *dummies > 0 {
		return storeLocal(ctx, *dummies, *hot, c.ValueSize, c.Duration, *asJSON, out)
	}
	res, err := bench.RunStore(ctx, c)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(out).Encode(res)
	}
	printStore(out, res)
	return nil
}

func printStore(out io.Writer, r *bench.StoreResult) {
	if r.Operation == "meta" {
		fmt.Fprintf(out, "master metadata: %d objects of %d bytes, BatchPutStart+BatchPutEnd of %d keys, %d connections x %d workers, master %s over %s\n",
			r.Ops, r.ValueSize, r.Batch, r.Clients, r.Threads, r.Master, r.MasterProtocol)
		fmt.Fprintf(out, "%.0f objects/s in %.2f s; latency per RPC pair: p50 %.0f us, p99 %.0f us, p999 %.0f us; oplog %s\n",
			r.OpsPerSec, r.DurationS, r.P50us, r.P99us, r.P999us, r.Oplog)
		if r.Baseline != "none" {
			fmt.Fprintf(out, "%s (same run): %.0f objects/s; latency per RPC pair: p50 %.0f us, p99 %.0f us, p999 %.0f us\n",
				r.Baseline, r.BaselineOpsPerSec, r.BaselineP50us, r.BaselineP99us, r.BaselineP999us)
			fmt.Fprintf(out, "ratio crescent/%s: %.2f\n", r.Baseline, r.Ratio)
		}
		return
	}
	path := "zero copy (PutFrom/GetInto, registered buffers)"
	if !r.ZeroCopy {
		path = "Put/Get on heap memory (staged)"
	}
	procs := "in-process"
	if r.ClientProcesses {
		procs = "processes"
	}
	ahead := "put-ahead on (" + sizeName(int(r.PutAheadBytes)) + " per client"
	if r.Puts > 0 {
		ahead += fmt.Sprintf(", %.0f%% of puts in one round trip", 100*r.PutsAheadShare)
	}
	ahead += ")"
	if r.PutAhead < 0 {
		ahead = "put-ahead off"
	}
	replicas := fmt.Sprintf("replicas: asked %d, stored %d/%d min/max", r.Replicas, r.ReplicasStoredMin, r.ReplicasStoredMax)
	if r.UnderReplicatedPuts > 0 {
		replicas += fmt.Sprintf(" (%d puts under-replicated)", r.UnderReplicatedPuts)
	}
	fmt.Fprintf(out, "store %s, %s values, %d clients (%s) x %d threads, batch %d, %s, %s, %s, protocol %s, master %s over %s, oplog %s\n",
		r.Operation, sizeName(r.ValueSize), r.Clients, procs, r.Threads, r.Batch, replicas, path, ahead, r.Protocol, r.Master, r.MasterProtocol, r.Oplog)
	if r.OplogBytesPerPut > 0 || r.OplogCommitsPerSec > 0 {
		fmt.Fprintf(out, "oplog: %.0f bytes written per put, %.0f commits/s of %.1f entries, fdatasync %.0f us on average; the master's answers waited %.0f us on average for durability\n",
			r.OplogBytesPerPut, r.OplogCommitsPerSec, r.OplogEntriesPerCommit, r.OplogFsyncUs, r.OplogDurableWaitUs)
	}
	if r.LocationCache > 0 {
		fmt.Fprintf(out, "location cache: %d entries per client, %.1f%% of gets read from a cached location\n", r.LocationCache, 100*r.LocationHitShare)
	}
	if len(r.OplogWaits) > 0 {
		parts := make([]string, len(r.OplogWaits))
		for i, w := range r.OplogWaits {
			parts[i] = fmt.Sprintf("%s %d x %.0f us", w.RPC, w.Answers, w.WaitUs)
		}
		fmt.Fprintf(out, "oplog waits by RPC (answers x mean wait): %s\n", strings.Join(parts, ", "))
	}
	fmt.Fprintf(out, "crescent: %.0f ops/s, %.2f GB/s; latency per call: p50 %.0f us, p99 %.0f us, p999 %.0f us\n",
		r.OpsPerSec, r.ThroughputGBps, r.P50us, r.P99us, r.P999us)
	if r.Baseline != "none" {
		fmt.Fprintf(out, "%s (same run): %.0f ops/s, %.2f GB/s; latency per call: p50 %.0f us, p99 %.0f us, p999 %.0f us\n",
			r.Baseline, r.BaselineOpsPerSec, r.BaselineGBps, r.BaselineP50us, r.BaselineP99us, r.BaselineP999us)
		fmt.Fprintf(out, "ratio crescent/%s: %.2f\n", r.Baseline, r.Ratio)
	}
	if r.EvictedKeys != nil && *r.EvictedKeys > 0 {
		fmt.Fprintf(out, "warning: the master evicted %d keys during the run\n", *r.EvictedKeys)
	}
}

// storeClientMain is a client process of "store --client_processes".
func storeClientMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(storeClientCmd, flag.ContinueOnError)
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process to FILE.PID")
	traceFile := fs.String("trace", "", "write an execution trace of this process to FILE.PID")
	memProfile := fs.String("memprofile", "", "write an allocation profile of this process to FILE.PID at the end")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	perPID := func(p string) string {
		if p == "" {
			return ""
		}
		return fmt.Sprintf("%s.%d", p, os.Getpid())
	}
	stop, err := startCPUProfile(perPID(*cpuProfile))
	if err != nil {
		return err
	}
	defer stop()
	stopMem, err := startMemProfile(perPID(*memProfile))
	if err != nil {
		return err
	}
	defer stopMem()
	stopTrace, err := startTrace(perPID(*traceFile))
	if err != nil {
		return err
	}
	defer stopTrace()
	return bench.ServeStoreClient(ctx, os.Stdin, os.Stdout)
}
