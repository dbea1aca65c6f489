package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/internal/buildinfo"
	"github.com/crescent-kv/crescent/internal/logx"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

// setGlobalLog: run installs its logger as the process's (main only:
// tests run several clients in one process).
var setGlobalLog bool

func main() {
	setGlobalLog = true
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if code := exitCode(err); code != 0 {
		fmt.Fprintln(os.Stderr, "crescent-client:", err)
		os.Exit(code)
	}
}

// usageError is a bad command line: exit 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// errVersion: --version was printed.
var errVersion = errors.New("version printed")

// exitCode is main's exit status: 0 for success, -h and --version, 2 for
// a bad command line, 1 for anything else.
func exitCode(err error) int {
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp), errors.Is(err, errVersion):
		return 0
	case errors.As(err, &ue):
		return 2
	}
	return 1
}

type options struct {
	master, hostname, protocol, metadata string
	masterProtocol                       string
	segment, buffer, aheadBytes          int64
	metricsAddr                          string
	metricsPort                          int
	locationCache                        int
	heartbeat                            time.Duration
	clusterID                            string
	log                                  *logx.Options
	segmentFlag, bufferFlag              string // as given, for messages
	allowOvercommit                      bool
	local                                localOptions
	sec                                  securityOptions
	engineSec                            engineSecurity
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
	fs.IntVar(&o.locationCache, "location_cache", 0, "objects whose location the client caches, so repeated gets (its dummy clients' too) skip the master (0 = off)")
	ahead := fs.String("put_ahead_bytes", "64 MB", "pool memory the client's put-ahead reservations (space held for one-round-trip puts) may hold; at least the bytes of the batch puts in flight at once")
	fs.StringVar(&o.protocol, "protocol", "", `transports in order of preference, comma-separated, e.g. "shm,tcp" (default: the engine's)`)
	fs.StringVar(&o.metadata, "metadata_server", "P2PHANDSHAKE", "transfer engine metadata connection string")
	fs.IntVar(&o.metricsPort, "metrics_port", 9004, "HTTP port for /metrics, /metrics/summary and /health (0 = any free port)")
	fs.StringVar(&o.metricsAddr, "metrics_address", "0.0.0.0", "HTTP listen address")
	fs.DurationVar(&o.heartbeat, "heartbeat_interval", time.Second, "interval between heartbeats to the master")
	o.log = logx.Flags(fs, "info")
	fs.BoolVar(&o.allowOvercommit, "allow_overcommit", false, "start even when --global_segment_size plus --local_buffer_size exceed the memory available (MemAvailable, cgroup limit); the kernel may then OOM-kill this or another process")
	registerLocalFlags(fs, &o.local)
	registerSecurityFlags(fs, &o.sec)
	registerEngineFlags(fs, &o.engineSec, &o.sec)
	version := fs.Bool("version", false, "print the version and exit")
	fs.SetOutput(io.Discard) // errors are one line, from run's caller
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stderr, "usage: crescent-client [flags]\n\nExit codes: 0 ok (also after SIGTERM), 1 error, 2 usage error.\n\nflags:")
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		return o, err
	} else if err != nil {
		return o, usageError{err}
	}
	if *version {
		return o, errVersion
	}
	if fs.NArg() > 0 {
		return o, usagef("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if err := o.engineSec.check(); err != nil {
		return o, err
	}
	o.segmentFlag, o.bufferFlag = *seg, *buf
	if o.segment, err = parseSize(*seg); err != nil {
		return o, usagef("--global_segment_size: %w", err)
	}
	if o.buffer, err = parseSize(*buf); err != nil {
		return o, usagef("--local_buffer_size: %w", err)
	}
	if o.aheadBytes, err = parseSize(*ahead); err != nil {
		return o, usagef("--put_ahead_bytes: %w", err)
	}
	if o.locationCache < 0 {
		return o, usagef("--location_cache %d: want 0 (off) or a count", o.locationCache)
	}
	if o.metricsPort < 0 || o.metricsPort > 65535 {
		return o, usagef("--metrics_port %d out of range", o.metricsPort)
	}
	if o.heartbeat <= 0 {
		return o, usagef("--heartbeat_interval %v: must be positive", o.heartbeat)
	}
	if err := o.log.Validate(); err != nil {
		return o, usageError{err}
	}
	switch o.masterProtocol {
	case "auto", "crpc", "grpc", "grpc_tuned":
	default:
		return o, usagef("--master_protocol %q: want auto, crpc, grpc or grpc_tuned", o.masterProtocol)
	}
	if !strings.Contains(o.master, "://") { // other forms are the store client's
		if _, _, err := net.SplitHostPort(o.master); err != nil {
			return o, usagef("--master_server_address %q: want host:port", o.master)
		}
	}
	if err := o.sec.check(); err != nil {
		return o, usageError{err}
	}
	return o, nil
}

// checkAddrs gives an address that does not resolve or cannot be bound
// an error naming its flag, before the engine or the RPC layer words it
// ("no free handshake port", resolver jargon).
func checkAddrs(o options) error {
	if !strings.Contains(o.master, "://") {
		host, _, _ := net.SplitHostPort(o.master)
		if err := resolves(host); err != nil {
			return fmt.Errorf("--master_server_address %q: %w", o.master, err)
		}
	}
	if o.hostname == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(o.hostname)
	if err != nil {
		host, port = o.hostname, "0"
	}
	if err := resolves(host); err != nil {
		return fmt.Errorf("--local_hostname %q: %w", o.hostname, err)
	}
	if port == "0" || port == "" {
		// Only whether this host has the address: the engine picks the port.
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return fmt.Errorf("--local_hostname %q: not an address of this host: %w", o.hostname, err)
		}
		l.Close()
	}
	return nil
}

func resolves(host string) error {
	if host == "" || net.ParseIP(host) != nil {
		return nil
	}
	if _, err := net.LookupHost(host); err != nil {
		return fmt.Errorf("host %q does not resolve: %w", host, err)
	}
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, errVersion) {
		fmt.Fprintln(stdout, buildinfo.Line("crescent-client"))
	}
	if err != nil {
		return err
	}
	if err := checkAddrs(o); err != nil {
		return err
	}
	if _, err := o.local.localOpts(nil); err != nil { // before any memory is mounted
		return usageError{err}
	}
	if !o.allowOvercommit {
		if err := checkMemory(o); err != nil {
			return err
		}
	}
	log := o.log.New(stderr)
	if setGlobalLog {
		logx.SetGlobal(log)
	}
	cfg := store.Config{
		MasterAddr: o.master, ClusterID: o.clusterID, MasterProtocol: o.masterProtocol, LocalHostname: o.hostname, GlobalSegmentSize: o.segment,
		LocalBufferSize: o.buffer, PutAheadBytes: o.aheadBytes, LocationCache: o.locationCache, MetadataServer: o.metadata, HeartbeatInterval: o.heartbeat, Logger: log,
		AllowOvercommit: o.allowOvercommit,
	}
	if o.protocol != "" {
		for _, p := range strings.Split(o.protocol, ",") {
			cfg.Protocols = append(cfg.Protocols, strings.TrimSpace(p))
		}
	}
	mode, _ := o.sec.mode() // checked by parseFlags
	if err := o.sec.apply(&cfg); err != nil {
		return usageError{err}
	}
	// Listen first: a port conflict should fail before memory is mounted.
	lis, err := net.Listen("tcp", net.JoinHostPort(o.metricsAddr, strconv.Itoa(o.metricsPort)))
	if err != nil {
		return fmt.Errorf("--metrics_address/--metrics_port: %w", err)
	}
	defer lis.Close() // until the server owns it

	cfg.EngineInsecure, cfg.MooncakeCompat = o.engineSec.insecure, o.engineSec.mooncakeCompat
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, err := store.New(startCtx, cfg)
	cancel()
	if errors.Is(err, errcode.ErrRPCFail) || errors.Is(err, errcode.ErrRPCTimeout) {
		return fmt.Errorf("--master_server_address %s: master not reachable: %w", o.master, err)
	}
	if err != nil {
		return err
	}
	stopLocal, err := startLocal(c, o.local, log)
	if err != nil {
		c.Close()
		return err
	}
	stopLocal = sync.OnceFunc(stopLocal)
	defer stopLocal()
	srv := serveMetrics(lis, mode, log, newHandler(c, time.Now()))

	for _, s := range c.Segments() {
		fmt.Fprintf(stdout, "crescent-client: segment %s (%s, %d bytes) mounted on master %s\n", s.Name, s.ID, s.Size, o.master)
	}
	fmt.Fprintf(stdout, "crescent-client: metrics on http://%s\n", lis.Addr())

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("stopping: unmounting segments")
	case <-srv.Served():
		serveErr = srv.Err()
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	srv.Shutdown(shutCtx)
	cancel()
	stopLocal() // dummies first: they call into c
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
	if strings.HasPrefix(t, "-") {
		return 0, fmt.Errorf("size %q: must not be negative", s)
	}
	if err != nil || num == "" {
		return 0, fmt.Errorf("size %q: not a number with an optional unit (4096, 512MiB, \"4 GB\")", s)
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
