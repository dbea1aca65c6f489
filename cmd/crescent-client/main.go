package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "crescent-client:", err)
		os.Exit(1)
	}
}

type options struct {
	master, hostname, protocol, metadata string
	masterProtocol                       string
	segment, buffer                      int64
	metricsAddr                          string
	metricsPort                          int
	heartbeat                            time.Duration
	clusterID                            string
	logLevel                             string
	segmentFlag, bufferFlag              string // as given, for messages
	allowOvercommit                      bool
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("crescent-client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.master, "master_server_address", store.DefaultMasterAddr, "master address host:port, or for masters in HA where the leader view lives: etcd://h:p[,h2:p2] or redis://h:p")
	fs.StringVar(&o.clusterID, "cluster_id", store.DefaultClusterID, "HA cluster id of the masters (their --cluster_id)")
	fs.StringVar(&o.masterProtocol, "master_protocol", "auto", "protocol to the master: auto (crpc when it answers, else gRPC), crpc or grpc")
	fs.StringVar(&o.hostname, "local_hostname", "", `transfer engine host or host:port (default: this host's first IPv4 address, port chosen in 15000-17000)`)
	seg := fs.String("global_segment_size", "4 GB", `memory contributed to the pool ("4 GB", "512MiB", bytes; units are powers of 1024; 0 = none)`)
	buf := fs.String("local_buffer_size", "64 MB", "staging buffer pool for transfers")
	fs.StringVar(&o.protocol, "protocol", "", `transports in order of preference, comma-separated, e.g. "shm,tcp" (default: the engine's)`)
	fs.StringVar(&o.metadata, "metadata_server", "P2PHANDSHAKE", "transfer engine metadata connection string")
	fs.IntVar(&o.metricsPort, "metrics_port", 9004, "HTTP port for /metrics, /metrics/summary and /health (0 = any free port)")
	fs.StringVar(&o.metricsAddr, "metrics_address", "0.0.0.0", "HTTP listen address")
	fs.DurationVar(&o.heartbeat, "heartbeat_interval", time.Second, "interval between heartbeats to the master")
	fs.StringVar(&o.logLevel, "log_level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.allowOvercommit, "allow_overcommit", false, "start even when --global_segment_size plus --local_buffer_size exceed the memory available (MemAvailable, cgroup limit); the kernel may then OOM-kill this or another process")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	o.segmentFlag, o.bufferFlag = *seg, *buf
	if o.segment, err = parseSize(*seg); err != nil {
		return o, fmt.Errorf("--global_segment_size: %w", err)
	}
	if o.buffer, err = parseSize(*buf); err != nil {
		return o, fmt.Errorf("--local_buffer_size: %w", err)
	}
	if o.metricsPort < 0 || o.metricsPort > 65535 {
		return o, fmt.Errorf("--metrics_port %d out of range", o.metricsPort)
	}
	if o.heartbeat <= 0 {
		return o, fmt.Errorf("--heartbeat_interval must be positive")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log_level: %w", err)
	}
	if !o.allowOvercommit {
		if err := checkMemory(o); err != nil {
			return err
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg := store.Config{
		MasterAddr: o.master, ClusterID: o.clusterID, MasterProtocol: o.masterProtocol, LocalHostname: o.hostname, GlobalSegmentSize: o.segment,
		LocalBufferSize: o.buffer, MetadataServer: o.metadata, HeartbeatInterval: o.heartbeat, Logger: log,
		AllowOvercommit: o.allowOvercommit,
	}
	if o.protocol != "" {
		for _, p := range strings.Split(o.protocol, ",") {
			cfg.Protocols = append(cfg.Protocols, strings.TrimSpace(p))
		}
	}
	// Listen first: a port conflict should fail before memory is mounted.
	lis, err := net.Listen("tcp", net.JoinHostPort(o.metricsAddr, strconv.Itoa(o.metricsPort)))
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	defer lis.Close()

	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, err := store.New(startCtx, cfg)
	cancel()
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: newHandler(c, time.Now()), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()

	for _, s := range c.Segments() {
		fmt.Fprintf(stdout, "crescent-client: segment %s (%s, %d bytes) mounted on master %s\n", s.Name, s.ID, s.Size, o.master)
	}
	fmt.Fprintf(stdout, "crescent-client: metrics on http://%s\n", lis.Addr())

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("stopping: unmounting segments")
	case serveErr = <-served:
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	srv.Shutdown(shutCtx)
	cancel()
	if err := c.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	fmt.Fprintln(stdout, "crescent-client: segments unmounted, exiting")
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}

// availableMemory is mempool.Available; the process tests replace it in
// the child to try limits smaller than the host's.
var availableMemory = mempool.Available

// checkMemory refuses, before anything is allocated, a segment and
// staging buffer that the host (or the cgroup) cannot back: prefaulting
// them would end in the OOM killer, which may take another process too.
func checkMemory(o options) error {
	buf := o.buffer
	if buf == 0 {
		buf = store.DefaultLocalBufferSize
	}
	need := o.segment + buf
	m, err := availableMemory()
	if err != nil {
		return fmt.Errorf("cannot check --global_segment_size and --local_buffer_size against the memory available: %w (--allow_overcommit skips the check)", err)
	}
	if need > m.Bytes {
		return fmt.Errorf("%w: --global_segment_size %q plus --local_buffer_size %q need %s, more than the %s available (%s); "+
			"lower --global_segment_size (at most %s with this buffer) or pass --allow_overcommit",
			mempool.ErrNotEnoughMemory, o.segmentFlag, o.bufferFlag, mempool.FormatSize(need), mempool.FormatSize(max(m.Bytes, 0)),
			m.From, mempool.FormatSize(max(m.Bytes-buf, 0)))
	}
	return nil
}

// parseSize reads sizes as the reference does: a number, optionally
// fractional, then an optional unit B, K/KB/KiB, M/MB/MiB, G/GB/GiB,
// T/TB/TiB (case-insensitive, all powers of 1024).
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToUpper(strings.TrimSpace(t[i:]))
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || num == "" {
		return 0, fmt.Errorf("size %q: not a number", s)
	}
	mult := map[string]float64{
		"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
		"G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40,
	}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("size %q: unknown unit %q", s, unit)
	}
	if b := v * mult; b < 1<<62 {
		return int64(b), nil
	}
	return 0, fmt.Errorf("size %q: too large", s)
}
